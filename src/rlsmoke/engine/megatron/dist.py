"""megatron-core's process groups for a `Parallel` layout: gloo on CPU, NCCL on GPUs."""

from __future__ import annotations

import os

import torch

from rlsmoke.bridge.convert import Parallel
from rlsmoke.engine.sharded import free_port


def init(rank: int, par: Parallel, port: int, *, backend: str = "gloo") -> None:
    """Join the world of `par` as `rank` and build megatron-core's model-parallel groups."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, rank=rank, world_size=par.world_size)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tp,
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.expert_tp,
    )


def close() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_ranks(fn, par: Parallel, *args, backend: str = "gloo") -> list:
    """Run `fn(rank, par, *args)` on every rank of `par` in its own process; the ranks' results."""
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, par, port, backend, queue, args))
             for r in range(par.world_size)]  # fmt: skip
    for p in procs:
        p.start()
    results: dict[int, object] = {}
    errors = []
    for _ in procs:
        rank, ok, value = queue.get()
        (results.__setitem__(rank, value) if ok else errors.append(f"rank {rank}: {value}"))
    for p in procs:
        p.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return [results[r] for r in range(par.world_size)]


def _rank_main(fn, rank, par, port, backend, queue, args):
    import traceback

    torch.set_num_threads(1)
    try:
        init(rank, par, port, backend=backend)
        value = fn(rank, par, *args)
        queue.put((rank, True, value))
    except BaseException:  # the parent must hear of every rank, or it waits forever
        queue.put((rank, False, traceback.format_exc(limit=-6)))
    finally:
        try:
            close()
        except Exception:
            pass
