"""The fixed Miles flag and env substitutions between NVIDIA and ROCm, each with why it differs. A row can
hold for some launchers only (`Target.launcher`); counts are the topology's."""

from __future__ import annotations

from dataclasses import dataclass

SEED_004 = "seed-004"  # the seeds' launch scripts, Miles of May 2026
MAIN_2026_08 = "main-2026-08"  # Miles main's GLM-5 launchers and its 2-GPU CI test (31f1ca961)


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
    launchers: tuple[str, ...] = ()  # the launchers the row holds for; empty: every one
    modes: tuple[str, ...] = ()  # the modes it holds in; empty: both
    dsa_only: bool = False  # only for models with the DSA indexer
    max_train_gpus: int | None = None  # only when the actor has at most this many GPUs

    def flags(self, platform: str) -> tuple[str, ...]:
        return self.rocm if platform == "rocm" else self.nvidia

    def env(self, platform: str) -> dict[str, str]:
        return dict(self.rocm_env if platform == "rocm" else self.nvidia_env)

    def holds(self, launcher: str, mode: str, uses_dsa: bool, train_gpus: int) -> bool:
        return ((not self.launchers or launcher in self.launchers) and (not self.modes or mode in self.modes)
                and (uses_dsa or not self.dsa_only)
                and (self.max_train_gpus is None or train_gpus <= self.max_train_gpus))  # fmt: skip


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
        "optimizer offload", "optimizer",
        nvidia=("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"),
        launchers=(MAIN_2026_08,), max_train_gpus=2,
        why="Miles main's 2-GPU CI test (enable_optimizer_offload); ROCm offloads at every size",
    ),
    Substitution(
        "weights backuper", "misc",
        nvidia=("--disable-weights-backuper",), launchers=(SEED_004,),
        why="segfaults in async mode (the memory saver is never enabled there)",
    ),
    Substitution(
        "weights rematerialize", "misc",
        nvidia=("--rematerialize-param-from-master-weight",), rocm=("--rematerialize-param-from-master-weight",),
        launchers=(MAIN_2026_08,), modes=("colocate",), dsa_only=True,
        why="replaces the backuper flag (removed in #2223) in Miles main's GLM-5 launchers; its GLM-4.5 launcher "
            "passes neither, and Miles asserts --colocate with it, so async renders neither",
    ),
    Substitution(
        "all-gather CP", "misc",
        nvidia=("--allgather-cp",), rocm=("--allgather-cp",), launchers=(MAIN_2026_08,), dsa_only=True,
        why="Miles main's GLM-5 launchers pass it at any CP: DSA with CP uses the sequential all-gather layout",
    ),
    Substitution(
        "NSA kernels", "sglang",
        nvidia=("--sglang-{dsa}-decode-backend", "flashmla_sparse", "--sglang-{dsa}-prefill-backend", "flashmla_sparse"),
        rocm=("--sglang-{dsa}-decode-backend", "tilelang", "--sglang-{dsa}-prefill-backend", "tilelang"),
        dsa_only=True, why="no FlashMLA on AMD",
    ),
    Substitution(
        "KV-cache dtype", "sglang",
        nvidia=("--sglang-kv-cache-dtype", "bf16"), launchers=(MAIN_2026_08,), dsa_only=True,
        why="Miles main's NVIDIA launcher (#1477); its AMD GLM-5.2 launcher sets fp8_e4m3, which rlsmoke does not "
            "render: an FP8 KV cache would make the ROCm rollout's numerics differ from the NVIDIA launch's",
    ),
    Substitution(
        "page size", "sglang", nvidia=("--sglang-page-size", "64"), why="the NSA pool needed page size 1 then"
    ),
    Substitution(
        "CUDA graph, concurrency, chunked prefill", "sglang",
        nvidia=("--sglang-{cuda_graph_bs}", "256", "--sglang-max-running-requests", "512",
                "--sglang-chunked-prefill-size", "16384"), launchers=(SEED_004,),
        why="seed 004's ROCm port runs SGLang's defaults",
    ),
    Substitution(
        "CUDA graph, concurrency, chunked prefill", "sglang",
        nvidia=("--sglang-{cuda_graph_bs}", "256", "--sglang-max-running-requests", "512",
                "--sglang-chunked-prefill-size", "{chunked_prefill}"), launchers=(MAIN_2026_08,),
        why="chunked prefill 2048 x the engine's GPUs, as Miles main's launcher; ROCm keeps seed 004's SGLang "
            "defaults (Miles' AMD GLM-5.2 launcher sets a CUDA-graph batch of 32 and the same chunked prefill)",
    ),
    Substitution("all-reduce", "sglang", rocm=("--sglang-disable-custom-all-reduce",), why="required on AMD"),
    Substitution(
        "NVIDIA env", "env",
        nvidia_env=(("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "256"), ("SGLANG_NSA_FORCE_MLA", "1"),
                    ("INDEXER_ROPE_NEOX_STYLE", "0"), ("NVSHMEM_DISABLE_NCCL", "1")),
        why="NVIDIA-specific (DeepEP, NVSHMEM); for Miles main ROCm gets the two DSA variables too (below)",
    ),
    Substitution(
        "DSA indexer env on ROCm", "env",
        rocm_env=(("INDEXER_ROPE_NEOX_STYLE", "0"), ("SGLANG_NSA_FORCE_MLA", "1")),
        launchers=(MAIN_2026_08,), dsa_only=True,
        why="Miles' AMD GLM-5.2 launcher keeps both: the DSA indexer uses interleaved RoPE on every platform",
    ),
    Substitution(
        "ROCm env", "env",
        rocm_env=(("SGLANG_SET_CPU_AFFINITY", "0"), ("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "1")),
        why="otherwise Ray rewrites HIP visibility and SGLang's import-time probe finds no GPU",
    ),
)  # fmt: skip
