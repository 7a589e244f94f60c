"""What the engine's step asks of its workers, declared once (`engine.run` calls only these).

A placement (`Colocated`, `RayAsync`, `engine.sharded.Sharded`) answers the whole step; the trainer
side of a colocated placement is a `TrainSide` (`TrainWorker`, the megatron trainer's worker). Where
a worker's train state and rollout copy take turns on a device (`engine.offload.Phases`), each
method that needs one side there is `@phased`: the move happens before the method, in one place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

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

    def forward_only(self, groups) -> list: ...
    def step(self, groups, old, advantages) -> dict[str, float]: ...
    def rollout_weights(self, model, dtype) -> Any: ...
    def set_variant(self, inject, temperature: float) -> None: ...
    def drop_optimizer_state(self) -> None: ...


def phased(phase: str, *, step: bool = False) -> Callable[[F], F]:
    """The method runs in `phase` ("rollout", "train" or "sync") of its worker's `phases`; `step`: the
    optimizer's state comes to the device too."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def entered(self, *args, **kwargs):
            self.phases.enter(phase)
            if step:
                self.phases.for_step()
            return method(self, *args, **kwargs)

        return entered  # type: ignore[return-value]

    return wrap
