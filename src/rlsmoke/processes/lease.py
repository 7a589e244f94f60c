"""GPU and port leases shared by every pytest worker (and session) on one host: flock'ed files in one
host-wide folder, so two workers or users never share a GPU or port, and a dead process releases its own.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from rlsmoke.artifacts import try_lock
from rlsmoke.engine.procs import bindable
from rlsmoke.platforms import PLATFORMS, visible_ids

DEFAULT_LEASE_DIR = Path(tempfile.gettempdir()) / f"rlsmoke-leases-{os.getuid()}"
PORT_BASE = 21000  # above Ray's defaults (6379, 8265, 10001-19999) so a stray default cluster never collides
PORT_BLOCK = 100  # ports per block: the named ports below plus a worker-port range for Ray
PORT_BLOCKS = 117  # 21000..32699: below Linux's ephemeral range (32768+), which outgoing sockets share


def lease_dir() -> Path:
    path = Path(os.environ.get("RLSMOKE_LEASE_DIR") or DEFAULT_LEASE_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def visible_gpu_ids(platform: str, count: int) -> tuple[str, ...]:
    """The GPU ids this process may hand out: the visible-devices variable if set, else 0..count-1."""
    return (visible_ids(platform) or tuple(str(i) for i in range(count)))[:count]


@dataclass
class GpuLease:
    """GPU ids held by this process until `release()`. `env()` is what a launched process needs."""

    platform: str
    ids: tuple[str, ...]
    _locks: list[int] = field(default_factory=list, repr=False)  # each held GPU's locked fd

    def env(self) -> dict[str, str]:
        var = PLATFORMS[self.platform].visible_devices_var
        return {var: ",".join(self.ids)} if var and self.ids else {}

    def release(self) -> None:
        for fd in self._locks:
            os.close(fd)
        self._locks.clear()


def lease_gpus(platform: str, pool: tuple[str, ...], n: int, *, timeout: float = 3600.0,
               poll: float = 0.2, folder: Path | None = None) -> GpuLease:  # fmt: skip
    """Hold `n` free GPU ids of `pool` all-or-nothing under one lock (no deadlock), up to `timeout` s."""
    if n > len(pool):
        raise ValueError(
            f"n={n} GPUs asked for but the pool has {len(pool)} ({','.join(pool)}). Adjust --num-gpus."
        )
    folder = folder or lease_dir()
    deadline = time.monotonic() + timeout
    while True:
        with FileLock(str(folder / "allocator.lock")):
            held: dict[str, int] = {}
            for gpu in pool:
                if (fd := try_lock(folder / f"gpu-{gpu}.lock")) is not None:
                    held[gpu] = fd
                if len(held) == n:
                    return GpuLease(platform, tuple(held), list(held.values()))
            for fd in held.values():
                os.close(fd)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"waited {timeout:.0f} s for {n} free GPUs of {','.join(pool)} (lock dir {folder})"
            )
        time.sleep(poll)


# Offsets inside a block. Ray's worker ports take the tail of the block.
PORT_NAMES = {
    "gcs": 0, "dashboard": 1, "client_server": 2, "dashboard_agent_listen": 3, "dashboard_agent_grpc": 4,
    "metrics_export": 5, "node_manager": 6, "object_manager": 7, "runtime_env_agent": 8, "master": 9,
}  # fmt: skip
WORKER_PORTS = (20, PORT_BLOCK - 1)  # first and last offset of Ray's worker-port range


@dataclass
class PortLease:
    """A block of ports that no other lease holder on this host uses."""

    base: int
    _lock: int | None = field(default=None, repr=False)  # the block's locked fd

    def __getattr__(self, name: str) -> int:
        if name in PORT_NAMES:
            return self.base + PORT_NAMES[name]
        raise AttributeError(name)

    @property
    def worker_ports(self) -> tuple[int, int]:
        return self.base + WORKER_PORTS[0], self.base + WORKER_PORTS[1]

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def lease_ports(*, start: int = 0, folder: Path | None = None, base: int | None = None) -> PortLease:
    """The first free block from `start` whose ports are also bindable now."""
    folder = folder or lease_dir()
    base = base if base is not None else int(os.environ.get("RLSMOKE_PORT_BASE", PORT_BASE))
    for i in range(PORT_BLOCKS):
        block = base + (start + i) % PORT_BLOCKS * PORT_BLOCK
        if (fd := try_lock(folder / f"ports-{block}.lock")) is None:
            continue
        if all(bindable(block + off) for off in PORT_NAMES.values()):
            return PortLease(block, fd)
        os.close(fd)
    raise RuntimeError(
        f"no free port block of {PORT_BLOCK} from {base} (lock dir {folder}). Set RLSMOKE_PORT_BASE."
    )
