"""Platforms, device classes, detection, and the NVIDIA -> ROCm substitutions as data.

Detection never imports torch: it reads `nvidia-smi` / `rocm-smi` (or `amd-smi`) output, so
`rlsmoke plan` stays fast and works on a login node.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from rlsmoke.errors import UnknownNameError


@dataclass(frozen=True)
class Platform:
    name: str  # "nvidia" | "rocm" | "cpu"
    devices: tuple[str, ...]  # device classes rlsmoke knows thresholds and memory for
    visible_devices_var: str | None
    default_mode: str  # seed 004: colocate on NVIDIA, async on ROCm
    torch_device: str


PLATFORMS = {
    "nvidia": Platform("nvidia", ("H100", "H200", "B200", "B300"), "CUDA_VISIBLE_DEVICES", "colocate", "cuda"),
    # ROCm torch still calls its devices "cuda"; HIP_VISIBLE_DEVICES is what SGLang's probe reads.
    "rocm": Platform("rocm", ("MI300X", "MI355X"), "HIP_VISIBLE_DEVICES", "async", "cuda"),
    "cpu": Platform("cpu", ("CPU",), None, "colocate", "cpu"),
}

# Memory per device (GiB) for the OOM estimate and the case-fits checks.
DEVICE_MEMORY_GIB = {
    "H100": 80, "H200": 141, "B200": 180, "B300": 270, "MI300X": 192, "MI355X": 288, "CPU": 0,
}  # fmt: skip


def get_platform(name: str) -> Platform:
    if name not in PLATFORMS:
        raise UnknownNameError(
            f"platform={name!r} is unknown", rule="platform.known", fix=f"use one of: {', '.join(PLATFORMS)}"
        )
    return PLATFORMS[name]


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


# Flags that depend on counts (mode, GPU accounting, train grid, SGLang layout) are derived by the
# topology; these rows are the fixed substitutions. `{...}` is filled from the plan.
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

# Rows of the table whose values the topology derives (listed so `--diff` can explain them).
DERIVED_ROWS = {
    "mode": "colocate + train.py on NVIDIA; async + train_async.py, half the GPUs rolling out, on ROCm",
    "GPU accounting": "Ray must see the actor GPUs plus the rollout GPUs",
    "train grid": "EP must divide the experts; ROCm trains on half the GPUs",
    "SGLang layout": "rollout engines fit the rollout GPUs; dp divides the GPUs per engine",
    "visible devices": "HIP_VISIBLE_DEVICES=0..NUM_GPUS-1 on ROCm",
}


@dataclass(frozen=True)
class Host:
    platform: str
    device: str  # e.g. "H200", "MI355X", "CPU"
    count: int

    def describe(self) -> str:
        if self.platform == "cpu":
            return "no GPU (CPU only)"
        return f"{self.count} {'NVIDIA' if self.platform == 'nvidia' else 'ROCm'} {self.device}"


def _device_class(platform: str, product_name: str) -> str:
    upper = product_name.upper()
    for device in PLATFORMS[platform].devices:
        if device in upper:
            return device
    return product_name.strip() or "unknown"


def _query(argv: list[str]) -> list[str]:
    import shutil
    import subprocess  # imported here: a plan never detects, and stays light

    if not shutil.which(argv[0]):
        return []
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


@functools.cache
def detect() -> Host:
    """The GPUs of this host, honouring the visible-devices variable. Never imports torch."""
    names = _query(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if names:
        return Host("nvidia", _device_class("nvidia", names[0]), _visible_count("nvidia", len(names)))
    names = [line for line in _query(["rocm-smi", "--showproductname"]) if "Card series" in line or "Card SKU" in line]
    if names:
        count = len([n for n in names if "Card series" in n]) or len(names)
        return Host("rocm", _device_class("rocm", names[0].split(":")[-1]), _visible_count("rocm", count))
    return Host("cpu", "CPU", 0)


def _visible_count(platform: str, physical: int) -> int:
    var = PLATFORMS[platform].visible_devices_var
    value = os.environ.get(var or "", None)
    if value is None or value == "":
        return physical
    return min(physical, len([v for v in value.split(",") if v.strip()]))
