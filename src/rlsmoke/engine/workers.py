"""What the engine's step asks of its workers, declared once (`engine.run` calls only these). Where a
train state and a rollout copy take turns on a device (`SharedDevice`), `@phased` moves them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from rlsmoke.engine import reuse, sync

F = TypeVar("F", bound=Callable[..., Any])


class Placement(Protocol):
    where: dict  # the processes and devices each side runs on

    def manual_seed(self, seed: int) -> None: ...
    def generate(self, prompt_ids, n, seed) -> list: ...
    def forward_only(self, groups) -> list: ...
    def step(self, groups, old, advantages) -> dict[str, float]: ...
    def sync(self, *, skip: bool) -> dict[str, float]: ...
    def drop_optimizer_state(self) -> None: ...
    def memory(self) -> list: ...
    def move_seconds(self) -> dict[str, float]: ...
    def parallel(self) -> dict: ...
    def keep_initial(self) -> None: ...
    def restore_initial(self) -> None: ...
    def set_variant(self, inject, temperature: float) -> None: ...
    def close(self) -> None: ...


class TrainSide(Protocol):
    trainer: Any  # engine.train.Trainer, or the megatron trainer

    def rollout_weights(self, model, dtype) -> Any: ...


def phased(phase: str, *, step: bool = False) -> Callable[[F], F]:
    """The method runs in `phase` of its worker's `phases`; `step`: the optimizer's state comes back too."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def entered(self, *args, **kwargs):
            self.phases.enter(phase)
            if step:
                self.phases.for_step()
            return method(self, *args, **kwargs)

        return entered  # type: ignore[return-value]

    return wrap


class TrainCalls:
    """The train side's calls, alike in a Ray actor (`placement.TrainWorker`) and on a shared device."""

    trainer: Any  # engine.train.Trainer, or the megatron trainer

    def manual_seed(self, seed: int) -> None:
        """The seed's draws (train-dropout's masks) start from it in every process, as in one."""
        torch.manual_seed(seed)

    def forward_only(self, groups) -> list:
        return self.trainer.forward_only(groups)

    def step(self, groups, old, advantages) -> dict[str, float]:
        return self.trainer.step(groups, old, advantages)

    def drop_optimizer_state(self) -> None:
        """AdamW's moments after the last step: nothing reads them (GLM-4.5 4-layer: 48 GiB less to park)."""
        self.trainer.optimizer.state.clear()


class SharedDevice(TrainCalls):
    """A trainer and a rollout copy taking turns on one device; a rank rolls out `prompt_ids[rank::world]`."""

    cfg: Any  # engine.config.RunConfig
    rollout_model: Any
    engine: Any  # engine.rollout.RolloutEngine
    phases: Any  # engine.offload.Phases
    rollout_weights: Callable[[], Any]  # the trainer's weights in the rollout copy's form: what a sync loads
    rank, world = 0, 1

    @phased("rollout")
    def generate(self, prompt_ids, n: int, seed: int) -> list:
        return self.engine.generate(
            prompt_ids, n, seed, indices=list(range(len(prompt_ids)))[self.rank :: self.world]
        )

    forward_only = phased("train")(TrainCalls.forward_only)
    step = phased("train", step=True)(TrainCalls.step)

    def move_seconds(self) -> dict[str, float]:
        return dict(self.phases.move_seconds)

    def memory(self) -> list:
        """Peak allocated device memory by phase (GiB), one entry per rank; [None] off CUDA."""
        return [self.phases.meter.report()]

    def offload_state(self) -> list[dict]:
        return [self.phases.state()]

    @phased("sync")
    def sync(self, *, skip: bool) -> dict[str, float]:
        return sync.load_and_compare(self.rollout_model, self.rollout_weights(), load=not skip)

    def keep_initial(self) -> None:
        """What a further seed of --repeat or --variants starts from (`engine.reuse`): the trainer's, and the
        rollout copy's as the sync rebuilds it."""
        self.initial_train = reuse.InitialState(self.trainer, self.cfg)
        self.initial_rollout = reuse.DerivedCopy(self.rollout_model, self.rollout_weights())

    @phased("sync")  # the weight sync's residency: main weights and the rollout copy on the device
    def restore_initial(self) -> None:
        self.initial_train.restore(self.trainer)
        self.initial_rollout.restore(self.rollout_model, self.rollout_weights())

    def set_variant(self, inject, temperature: float) -> None:
        """`rlsmoke run --variants`: the next run's fault and rollout temperature, on both sides."""
        self.engine.set_variant(inject, temperature)
        self.trainer.set_variant(inject, temperature)
        self.phases.sync_rewrites = not inject.skips_sync
