"""The fixed Miles flag and env substitutions between NVIDIA and ROCm, each with why it differs.

Flags that depend on counts (mode, GPU accounting, train grid, SGLang layout) are derived by the
topology; `launch.miles` renders these rows into a plan's groups and env.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Substitution:
    """One row of the NVIDIA -> ROCm table: what each platform adds, in which group, and why."""

    area: str
    group: str  # the argv group the flags belong to
    nvidia: tuple[str, ...] = ()
    rocm: tuple[str, ...] = ()
    nvidia_env: tuple[tuple[str, str], ...] = ()
    rocm_env: tuple[tuple[str, str], ...] = ()
    why: str = ""

    def flags(self, platform: str) -> tuple[str, ...]:
        return self.rocm if platform == "rocm" else self.nvidia

    def env(self, platform: str) -> dict[str, str]:
        return dict(self.rocm_env if platform == "rocm" else self.nvidia_env)


# `{...}` is filled from the plan.
SUBSTITUTIONS: tuple[Substitution, ...] = (
    Substitution(
        "optimizer", "optimizer",
        rocm=("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"),
        why="memory (the working Qwen3 async setup)",
    ),
    Substitution(
        "attention", "misc",
        nvidia=("--attention-backend", "flash"), rocm=("--attention-backend", "fused"),
        rocm_env=(("NVTE_FUSED_ATTN", "1"), ("NVTE_FLASH_ATTN", "0"), ("NVTE_UNFUSED_ATTN", "0")),
        why="TE's CK fused attention on AMD",
    ),
    Substitution(
        "MoE dispatch", "misc",
        nvidia=("--moe-enable-deepep", "--moe-token-dispatcher-type", "flex"),
        rocm=("--moe-token-dispatcher-type", "alltoall"),
        why="DeepEP needs NVIDIA IB and GPUDirect RDMA",
    ),
    Substitution(
        "grouped GEMM", "env",
        rocm_env=(("NVTE_USE_CUTLASS_GROUPED_GEMM", "1"), ("NVTE_CUTLASS_GROUPED_GEMM_WARN_FALLBACK", "1")),
        why="TE's CK grouped-GEMM path",
    ),
    Substitution(
        "weights backuper", "misc",
        nvidia=("--disable-weights-backuper",),
        why="segfaults in async mode (the memory saver is never enabled there)",
    ),
    Substitution(
        "NSA kernels", "sglang",
        nvidia=("--sglang-{dsa}-decode-backend", "flashmla_sparse", "--sglang-{dsa}-prefill-backend", "flashmla_sparse"),
        rocm=("--sglang-{dsa}-decode-backend", "tilelang", "--sglang-{dsa}-prefill-backend", "tilelang"),
        why="no FlashMLA on AMD",
    ),
    Substitution(
        "page size", "sglang", nvidia=("--sglang-page-size", "64"), why="the NSA pool needed page size 1 then"
    ),
    Substitution(
        "CUDA graph, concurrency, chunked prefill", "sglang",
        nvidia=("--sglang-{cuda_graph_bs}", "256", "--sglang-max-running-requests", "512",
                "--sglang-chunked-prefill-size", "16384"),
    ),
    Substitution("all-reduce", "sglang", rocm=("--sglang-disable-custom-all-reduce",), why="required on AMD"),
    Substitution(
        "NVIDIA env", "env",
        nvidia_env=(("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "256"), ("SGLANG_NSA_FORCE_MLA", "1"),
                    ("INDEXER_ROPE_NEOX_STYLE", "0"), ("NVSHMEM_DISABLE_NCCL", "1")),
        why="NVIDIA-specific",
    ),
    Substitution(
        "ROCm env", "env",
        rocm_env=(("SGLANG_SET_CPU_AFFINITY", "0"), ("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "1")),
        why="otherwise Ray rewrites HIP visibility and SGLang's import-time probe finds no GPU",
    ),
)  # fmt: skip
