"""megatron-core's process groups for a `Parallel` layout: gloo on CPU, NCCL on GPUs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlsmoke.bridge.convert import Parallel


def backend_for(device: str) -> str:
    """NCCL between GPUs, gloo between CPU processes: the one choice every megatron path makes."""
    return "nccl" if device.startswith("cuda") else "gloo"


def init(rank: int, par: Parallel, rendezvous: str | None = None, *, backend: str = "gloo") -> None:
    """Join the world of `par` as `rank` at `rendezvous` (an init_method URL), and build megatron-core's
    model-parallel groups. A world of one meets in a store of its own process: no port to collide on."""
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    where = {"init_method": rendezvous} if rendezvous else {"store": dist.HashStore()}
    dist.init_process_group(backend, rank=rank, world_size=par.world_size, **where)
    model_parallel(par)


def model_parallel(par: Parallel) -> None:
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tp,
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.expert_tp,
    )


def close() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
