"""`--repeat K` and `--variants` keep their workers: loading costs more than a seed.

The main parameters are kept in the narrowest dtype that gives them back bit for bit, on the device when
the estimate counts it, else in host memory; AdamW's moments are dropped. Derived copies are rebuilt as
the step and sync rebuild them, but parameters that rebuild would not reproduce are kept as they are.
Seed k then starts from the same bits as a fresh `--seed k` run (tests/unit/test_run_reuse.py).

A restore also ends deterministic mode's NaN fill of each `torch.empty` in its process (`first_seed_only`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.utils.deterministic

from rlsmoke.engine.model import TORCH_DTYPES
from rlsmoke.engine.offload import local_shard, pins

CHUNK = 1 << 24  # elements cast at a time: no device temporary larger than 64 MiB in fp32


def first_seed_only() -> None:
    """The NaN fill (an op that reads memory it never wrote shows as NaN, and the run's finite checks
    stop it) off from a further seed or run on: it runs the kernels the first seed ran with the fill,
    and the fill costs a launch per `torch.empty` (25,157 in a megatron seed of GLM-5 4-layer on an H200).
    Nothing correct reads what the fill wrote: seed k of a `--repeat` gives a fresh `--seed k` run's bits."""
    torch.utils.deterministic.fill_uninitialized_memory = False


def _resharded(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 leaves the root's parameters gathered after a forward: back to the shards we keep."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


@torch.no_grad()
def _narrowest_exact(t: torch.Tensor, narrow: torch.dtype | None) -> torch.dtype:
    """`narrow` when every element of `t` survives the round trip through it, else t's own dtype."""
    if narrow is None or narrow == t.dtype or not t.is_floating_point():
        return t.dtype
    flat = t.reshape(-1)
    for i in range(0, flat.numel(), CHUNK):
        part = flat[i : i + CHUNK]
        if not torch.equal(part.to(narrow).to(t.dtype), part):
            return t.dtype
    return narrow


def _device_copy(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # a copy even in t's own dtype: never the parameter itself (the twin aliases)
    return t.to(dtype, copy=True)


class Snapshot:
    """Parameters (FSDP2's local shards included) as they are now, in host memory or on their device."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module, *, narrow: torch.dtype | None = None, on_device: bool = False):
        params = [(name, local_shard(p.detach())) for name, p in _resharded(model).named_parameters()]
        dtypes = {name: _narrowest_exact(t, narrow) for name, t in params}
        nbytes = sum(t.numel() * dtypes[name].itemsize for name, t in params)
        device = params[0][1].device if params else torch.device("cpu")
        # on CPU a "device" copy is a host copy: the path CI runs
        pin = not on_device and pins(nbytes, device)
        self.tensors: dict[str, torch.Tensor] = {}
        for name, t in params:
            if on_device:
                self.tensors[name] = _device_copy(t, dtypes[name])
            else:
                host = torch.empty(t.shape, dtype=dtypes[name], device="cpu", pin_memory=pin)
                self.tensors[name] = host.copy_(t)

    @torch.no_grad()
    def restore(self, model: torch.nn.Module) -> None:
        for name, p in _resharded(model).named_parameters():
            local_shard(p.detach()).copy_(self.tensors[name], non_blocking=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()


class DerivedCopy:
    """A model rebuilt from the main weights (`derived`); kept: what the rebuild does not reproduce."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module, derived: Iterable[tuple[str, torch.Tensor]]):
        params, rebuilt = dict(model.named_parameters()), set()
        for name, t in derived:
            own = params.get(name)
            if own is not None and own.shape == t.shape and torch.equal(own, t.to(own.device, own.dtype)):
                rebuilt.add(name)
        self.kept = {name: p.detach().cpu().clone() for name, p in params.items() if name not in rebuilt}

    @torch.no_grad()
    def restore(self, model: torch.nn.Module, derived: Iterable[tuple[str, torch.Tensor]]) -> None:
        first_seed_only()  # a rollout process restores only this
        params = dict(model.named_parameters())
        for name, t in derived:  # consumed in full: under FSDP2 each item is a collective
            if name in params and name not in self.kept and params[name].shape == t.shape:
                params[name].copy_(t.to(params[name].device))
        for name, t in self.kept.items():
            params[name].copy_(t.to(params[name].device))


class InitialState:
    """A trainer's starting point: its main weights, and what of its compute copy they do not rebuild."""

    def __init__(self, trainer, cfg):
        # the main weights may be kept in the rollout dtype where it is narrower than the train dtype
        rollout, train = TORCH_DTYPES[cfg.rollout_dtype], TORCH_DTYPES[cfg.train_dtype]
        narrow = rollout if rollout.itemsize < train.itemsize else None
        self.master = Snapshot(trainer.master, narrow=narrow, on_device=cfg.initial_on_device)
        self.compute = DerivedCopy(trainer.model, _compute_from_master(trainer)) if trainer._pairs else None

    def restore(self, trainer) -> None:
        """Main weights as kept, no moments, no grads: a fresh optimizer's first step comes next."""
        first_seed_only()
        trainer.optimizer.zero_grad(set_to_none=True)
        for p in trainer.model.parameters():
            p.grad = None
        trainer.optimizer.state.clear()
        self.master.restore(trainer.master)
        if self.compute is not None:
            self.compute.restore(trainer.model, _compute_from_master(trainer))


def _compute_from_master(trainer):
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    return ((names[id(p)], main.detach().to(p.dtype)) for p, main in trainer._pairs)
