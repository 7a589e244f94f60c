"""The load's limits on a GPU host: the host's read bandwidth (a file from the page cache and cold from
disk where it can be dropped), the host-to-device / device-to-host copy, pageable and pinned, and what
pinning itself costs (a fresh pinned allocation, first-touching pageable pages) next to a staged move
(engine.offload.HostCopies) of the same bytes each way.

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
    del host
    torch._C._host_emptyCache()  # else the pinned block just freed is reused, not allocated
    print(f"pinned allocation, fresh: {gbps(nbytes, allocation_seconds(n, pin=True)):.1f} GB/s")
    print(f"pageable allocation and first touch: {gbps(nbytes, allocation_seconds(n, pin=False)):.1f} GB/s")
    from rlsmoke.engine.offload import PIN_MAX_BYTES, HostCopies

    staged = HostCopies(
        "cuda", park_bytes=PIN_MAX_BYTES + 1
    )  # past the pin budget: the offload's staged moves
    assert staged.staged
    start = time.perf_counter()
    parked = staged.to_host(dev)
    torch.cuda.synchronize()
    print(
        f"staged device to host (fresh pageable pages): {gbps(nbytes, time.perf_counter() - start):.1f} GB/s"
    )
    start = time.perf_counter()
    staged.to_device(parked)
    torch.cuda.synchronize()
    print(f"staged host to device: {gbps(nbytes, time.perf_counter() - start):.1f} GB/s")


def allocation_seconds(n: int, *, pin: bool) -> float:
    start = time.perf_counter()
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=pin)
    host.view(torch.uint8)[::4096].fill_(1)  # one byte a page: the first touch of every page
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
