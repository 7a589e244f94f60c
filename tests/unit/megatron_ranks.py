"""Test tooling: megatron-core ranks of a `Parallel` layout, one process each (the megatron trainer runs
one process; its multi-rank layouts are exercised here)."""

from __future__ import annotations

import pickle
import shutil
import tempfile

import torch

from rlsmoke.bridge.convert import Parallel
from rlsmoke.engine.megatron import dist as dist_
from rlsmoke.engine.megatron.dist import close, init

RANK_GRACE_S = (
    10.0  # how long the other ranks get to finish once one has failed, or to exit once all are done
)
RANK_MODULES = (
    "rlsmoke.engine.megatron.model",
    "rlsmoke.engine.megatron.trainer",
)  # what the ranks' steps run


def relayout(par: Parallel) -> None:
    """Re-form the model-parallel groups for `par` over the same world."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if par.world_size != dist.get_world_size():
        raise ValueError(f"{par} needs {par.world_size} ranks; the world has {dist.get_world_size()}")
    parallel_state.destroy_model_parallel()
    dist_.model_parallel(par)


def run_ranks(fn, par: Parallel, *args, backend: str = "gloo") -> list:
    """`fn(rank, par, *args)` on every rank in its own process; results pickled by value (torch's shared
    tensors die with their rank). A failed rank fails the call and stops the others."""
    from multiprocessing.connection import wait

    from rlsmoke.engine.procs import frozen_for_forks, rank_context

    rendezvous = tempfile.mkdtemp(prefix="rlsmoke-ranks-")  # a file, as the engine's ranks meet
    ctx = rank_context(cpu_only=backend == "gloo", rank_modules=RANK_MODULES)
    pending: dict = {}  # the read end of each rank's pipe -> rank
    procs = []
    results: dict[int, object] = {}
    errors: list[str] = []
    try:
        with frozen_for_forks():
            for rank in range(par.world_size):
                reader, writer = ctx.Pipe(duplex=False)
                proc = ctx.Process(
                    target=_rank_main,
                    args=(fn, rank, par, f"file://{rendezvous}/store", backend, writer, args),
                    daemon=True,
                )
                proc.start()
                writer.close()  # the rank's copy is its own: EOF here means the rank is gone
                pending[reader] = rank
                procs.append(proc)
        while pending:
            ready = wait(list(pending), timeout=RANK_GRACE_S if errors else None)
            if not ready:  # the others wait in a collective for a rank that failed
                errors += [
                    f"rank {rank}: stopped after another rank failed" for rank in sorted(pending.values())
                ]
                break
            for reader in ready:
                rank = pending.pop(reader)
                try:
                    ok, value = pickle.loads(reader.recv_bytes())
                except EOFError:
                    procs[rank].join(RANK_GRACE_S)
                    errors.append(f"rank {rank}: died (exit code {procs[rank].exitcode})")
                    continue
                if ok:
                    results[rank] = value
                else:
                    errors.append(f"rank {rank}: {value}")
    finally:
        for reader in pending:
            reader.close()
        for proc in procs:
            proc.join(timeout=RANK_GRACE_S if len(results) == len(procs) else 0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(rendezvous, ignore_errors=True)
    if errors:
        raise RuntimeError("; ".join(errors))
    return [results[r] for r in range(par.world_size)]


def _rank_main(fn, rank, par, rendezvous, backend, conn, args):
    import traceback

    from rlsmoke.engine import signals

    signals.in_rank()
    torch.set_num_threads(1)
    try:
        init(rank, par, rendezvous, backend=backend)
        reply = (True, fn(rank, par, *args))
    except BaseException:  # the driver must hear of every rank
        reply = (False, traceback.format_exc(limit=-6))
    try:
        payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        payload = pickle.dumps((False, f"its result does not pickle: {traceback.format_exc(limit=-2)}"))
    conn.send_bytes(payload)
    conn.close()
    try:
        close()
    except Exception:
        pass
