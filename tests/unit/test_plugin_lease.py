"""GPU and port leases under real concurrency: separate processes racing for the same locks."""

import multiprocessing as mp
import socket
import time
from pathlib import Path

import pytest

from rlsmoke.processes.lease import (
    PORT_BASE,
    PORT_BLOCK,
    PORT_BLOCKS,
    PORT_NAMES,
    GpuLease,
    lease_gpus,
    lease_ports,
    visible_gpu_ids,
)

POOL = tuple(str(i) for i in range(8))


def _processes():
    """Forked where nothing in this process makes that unsafe (each process opens its own lock files):
    a spawned one imports this module and the library again, a second or more each on a small host."""
    from rlsmoke.engine.procs import fork_is_safe

    return mp.get_context("fork" if fork_is_safe() else "spawn")


def _hold(args):
    folder, n, hold = args
    lease = lease_gpus("rocm", POOL, n, timeout=60, poll=0.01, folder=folder)
    start = time.monotonic()
    time.sleep(hold)
    end = time.monotonic()
    lease.release()
    return start, end, lease.ids


@pytest.mark.parametrize("n", [1, 3, 8])
def test_concurrent_leases_are_disjoint(tmp_path, n):
    """Eight processes each want n of 8 GPUs: whoever holds at the same time holds different GPUs."""
    with _processes().Pool(8) as pool:
        rows = pool.map(_hold, [(tmp_path, n, 0.2)] * 8)
    assert all(len(ids) == n for _, _, ids in rows)
    for i, (s1, e1, a) in enumerate(rows):
        for s2, e2, b in rows[i + 1 :]:
            if s1 < e2 and s2 < e1:
                assert not set(a) & set(b), f"overlapping leases share GPUs: {a} {b}"


def test_lease_waits_then_succeeds(tmp_path):
    first = lease_gpus("nvidia", POOL[:2], 2, folder=tmp_path)
    with pytest.raises(TimeoutError, match="waited 0 s for 1 free GPUs of 0,1"):
        lease_gpus("nvidia", POOL[:2], 1, timeout=0.2, poll=0.05, folder=tmp_path)
    first.release()
    second = lease_gpus("nvidia", POOL[:2], 1, timeout=1, folder=tmp_path)
    assert second.ids == ("0",)
    second.release()


def test_more_than_the_pool_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="n=9 GPUs asked for but the pool has 8"):
        lease_gpus("nvidia", POOL, 9, folder=tmp_path)


@pytest.mark.parametrize(("platform", "ids", "env"), [
    ("nvidia", ("2", "5"), {"CUDA_VISIBLE_DEVICES": "2,5"}),
    ("rocm", ("0", "1"), {"HIP_VISIBLE_DEVICES": "0,1"}),
    ("cpu", (), {}),
])  # fmt: skip
def test_lease_env(platform, ids, env):
    assert GpuLease(platform, ids).env() == env


def test_pool_honours_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert visible_gpu_ids("nvidia", 3) == ("3", "5", "7")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpu_ids("nvidia", 2) == ("0", "1")


def _ports(folder, base, reported, release):
    lease = lease_ports(start=0, folder=folder, base=base)
    reported.put(lease.base)
    release.wait(60)  # every holder holds at once: no process can free a block another then takes


def test_concurrent_port_leases_never_collide(tmp_path):
    base = 41000  # away from the default range so a live suite on this host does not interfere
    ctx = _processes()
    reported, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_ports, args=(tmp_path, base, reported, release)) for _ in range(6)]
    for p in procs:  # all start at block 0: the locks must spread them
        p.start()
    try:
        bases = [reported.get(timeout=120) for _ in procs]
    finally:
        release.set()
        for p in procs:
            p.join(30)
    assert len(set(bases)) == 6
    named = [b + off for b in bases for off in PORT_NAMES.values()]
    assert len(named) == len(set(named))
    assert all((b - base) % PORT_BLOCK == 0 for b in bases)


def test_a_bound_port_makes_the_block_skip(tmp_path):
    # below both the suite's own blocks and the kernel's ephemeral range (32768+), where another test's
    # outgoing socket could hold a port of the next block too
    base = 12000
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + PORT_NAMES["dashboard"]))
        s.listen()
        lease = lease_ports(folder=tmp_path, base=base)
    assert lease.base == base + PORT_BLOCK
    assert lease.master == lease.base + PORT_NAMES["master"]
    lease.release()


def test_every_block_lies_below_the_kernel_s_ephemeral_range():
    """Outgoing sockets (gloo's, Ray's) take their ports there: a block in it could be held by one."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ephemeral.is_file():
        pytest.skip("the ephemeral range is read from Linux's /proc")
    assert PORT_BASE + PORT_BLOCKS * PORT_BLOCK <= int(ephemeral.read_text().split()[0])
