"""The load's limits on a GPU host: the host's read bandwidth (a file from the page cache and cold from
disk where it can be dropped) and the host-to-device / device-to-host copy, pageable and pinned.

    python bench/gpu_limits.py [--gib 4] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def read_bandwidth(path: Path, nbytes: int) -> float:
    start = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        view = memoryview(buf)
        while f.readinto(view):
            pass
    return gbps(nbytes, time.perf_counter() - start)


def copy_bandwidth(src: torch.Tensor, dst: torch.Tensor, repeats: int = 3) -> float:
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return gbps(src.numel() * src.element_size() * repeats, time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    nbytes = int(args.gib * 2**30)
    path = Path(args.dir) / "rlsmoke-read-probe.bin"
    block = os.urandom(64 << 20)
    with path.open("wb") as f:
        for _ in range(nbytes // len(block)):
            f.write(block)
    size = path.stat().st_size
    print(f"read from the page cache: {read_bandwidth(path, size):.1f} GB/s ({size / 1e9:.1f} GB)")
    path.unlink()
    n = nbytes // 2
    dev = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    for kind, host in (("pageable", torch.empty(n, dtype=torch.bfloat16)),
                       ("pinned", torch.empty(n, dtype=torch.bfloat16, pin_memory=True))):  # fmt: skip
        host.fill_(1)
        print(f"host to device, {kind}: {copy_bandwidth(host, dev):.1f} GB/s")
        print(f"device to host, {kind}: {copy_bandwidth(dev, host):.1f} GB/s")


if __name__ == "__main__":
    main()
