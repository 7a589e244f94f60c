"""Platforms, device classes, their detection (from `nvidia-smi` / `rocm-smi`, never torch), and each
process's share of the CPU cores."""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

from rlsmoke.errors import require_known


@dataclass(frozen=True)
class Platform:
    name: str  # "nvidia" | "rocm" | "cpu"
    devices: tuple[str, ...]  # device classes rlsmoke knows thresholds and memory for
    visible_devices_var: str | None
    torch_device: str


PLATFORMS = {
    "nvidia": Platform("nvidia", ("H100", "H200", "B200", "B300"), "CUDA_VISIBLE_DEVICES", "cuda"),
    # ROCm torch still calls its devices "cuda"; HIP_VISIBLE_DEVICES is what SGLang's probe reads.
    "rocm": Platform("rocm", ("MI300X", "MI355X"), "HIP_VISIBLE_DEVICES", "cuda"),
    "cpu": Platform("cpu", ("CPU",), None, "cpu"),
}
VENDOR = {"nvidia": "NVIDIA", "rocm": "ROCm"}

# Memory per device (GiB) for the OOM estimate and the case-fits checks.
DEVICE_MEMORY_GIB = {
    "H100": 80, "H200": 141, "B200": 180, "B300": 270, "MI300X": 192, "MI355X": 288, "CPU": 0,
}  # fmt: skip


def get_platform(name: str) -> Platform:
    require_known("platform", name, PLATFORMS)
    return PLATFORMS[name]


@dataclass(frozen=True)
class Host:
    platform: str
    device: str  # e.g. "H200", "MI355X", "CPU"
    count: int

    def describe(self) -> str:
        if self.platform == "cpu":
            return "no GPU (CPU only)"
        return f"{self.count} {VENDOR[self.platform]} {self.device}"


def _device_class(platform: str, product_name: str) -> str:
    known = (d for d in PLATFORMS[platform].devices if d in product_name.upper())
    return next(known, product_name.strip() or "unknown")


def _query(argv: list[str]) -> list[str]:
    import subprocess  # imported here: a plan never detects, and stays light

    try:  # a tool that is not installed is an OSError too
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


@functools.cache
def detect() -> Host:
    """The GPUs of this host, honouring the visible-devices variable. Never imports torch."""
    if names := _query(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]):
        return Host("nvidia", _device_class("nvidia", names[0]), _visible_count("nvidia", len(names)))
    rocm = _query(["rocm-smi", "--showproductname"])
    if names := [line for line in rocm if "Card series" in line or "Card SKU" in line]:
        count = len([n for n in names if "Card series" in n]) or len(names)
        return Host("rocm", _device_class("rocm", names[0].split(":")[-1]), _visible_count("rocm", count))
    return Host("cpu", "CPU", 0)


def visible_ids(platform: str) -> tuple[str, ...] | None:
    """The ids the platform's visible-devices variable names; None where it is unset or empty."""
    value = os.environ.get(PLATFORMS[platform].visible_devices_var or "")
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else None


def _visible_count(platform: str, physical: int) -> int:
    ids = visible_ids(platform)
    return physical if ids is None else min(physical, len(ids))


# --- CPU cores: each pytest worker, and each engine process under it, gets its share -----------------

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_budget() -> int:
    """This process's threads: OMP_NUM_THREADS when set (a worker's share, or the user's), else the cores
    it may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_share(parts: int) -> int:
    return max(1, thread_budget() // max(1, parts))


def share_cores(workers: int) -> None:
    """Hold this pytest worker to 1/`workers` of the cores (inherited thread variables, torch's pool); a
    variable the user set is kept."""
    n = thread_budget() if os.environ.get("OMP_NUM_THREADS") else cpu_share(workers)
    for var in THREAD_VARS:  # all alike: torch's pool follows MKL's variable where MKL is its BLAS
        os.environ.setdefault(var, str(n))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
