"""The engine's workers against the interface the step calls (`rlsmoke.engine.workers`).

Every placement answers every method of `Placement` with its parameters, and every trainer side every
method of `TrainSide`; a sharded run's ranks answer every call their driver sends. The twin: a class
with a method missing or its parameters changed is named.
"""

import inspect
import re

import pytest

from rlsmoke.engine import sharded
from rlsmoke.engine.placement import Colocated, RayAsync, TrainWorker
from rlsmoke.engine.workers import Placement, TrainSide, phased


def _members(protocol) -> dict:
    return {name: getattr(protocol, name) for name in protocol.__dict__
            if not name.startswith("_") and inspect.isfunction(getattr(protocol, name))}  # fmt: skip


def _mismatches(cls, protocol) -> list[str]:
    wrong = []
    for name, declared in _members(protocol).items():
        own = getattr(cls, name, None)
        if own is None:
            wrong.append(f"{cls.__name__}.{name} is missing")
            continue
        theirs = [(p.name, p.kind) for p in inspect.signature(declared).parameters.values()]
        ours = [(p.name, p.kind) for p in inspect.signature(own).parameters.values()]
        if ours != theirs:
            wrong.append(f"{cls.__name__}.{name}{inspect.signature(own)} is not {name}{inspect.signature(declared)}")
    for attribute in getattr(protocol, "__annotations__", {}):
        if not any(f"self.{attribute} =" in inspect.getsource(c) for c in cls.__mro__ if c is not object):
            wrong.append(f"{cls.__name__} never sets {attribute}")
    return wrong


def _megatron_worker():
    from rlsmoke.engine.megatron.trainer import MegatronTrainWorker

    return MegatronTrainWorker


@pytest.mark.parametrize("cls", [Colocated, RayAsync, sharded.Sharded], ids=lambda c: c.__name__)
def test_every_placement_answers_the_step(cls):
    assert _mismatches(cls, Placement) == []


@pytest.mark.parametrize("cls", [TrainWorker, "megatron"], ids=["TrainWorker", "MegatronTrainWorker"])
def test_every_trainer_side_answers_its_placement(cls):
    if cls == "megatron":
        pytest.importorskip("megatron.core")
        cls = _megatron_worker()
    assert _mismatches(cls, TrainSide) == []


def test_a_rank_answers_every_call_its_driver_sends():
    sent = set(re.findall(r'self\._call\("(\w+)"', inspect.getsource(sharded.Sharded)))
    assert sent >= {"generate", "forward_only", "step", "sync", "memory", "keep_initial", "restore_initial"}
    assert sorted(name for name in sent if not callable(getattr(sharded.Rank, name, None))) == []


def test_a_worker_off_the_interface_is_named():
    class Drifted(Colocated):
        def sync(self, skip):  # positional, where the step passes skip= by name
            return {}

    wrong = _mismatches(Drifted, Placement)
    assert len(wrong) == 1 and wrong[0].startswith("Drifted.sync(self, skip) is not sync(self, *, skip"), wrong
    assert _mismatches(object, TrainSide)[0] == "object.forward_only is missing"


def test_a_phased_method_moves_its_side_to_the_device_first():
    entered = []

    class Phases:
        def enter(self, phase):
            entered.append(phase)

        def for_step(self):
            entered.append("optimizer")

    class Worker:
        phases = Phases()

        @phased("train", step=True)
        def step(self):
            entered.append("stepped")
            return "done"

    assert Worker().step() == "done" and entered == ["train", "optimizer", "stepped"]
