"""The engine's workers against the interface the step calls (`rlsmoke.engine.workers`).

Whether each placement and trainer side answers its protocol is the type checker's (CI's `mypy`, where
`open_workers` and `train_worker` return them); the twin here shows it names a worker off the interface.
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mypy(tmp_path, source: str) -> str:
    api = pytest.importorskip("mypy.api")
    module = tmp_path / "drifted.py"
    module.write_text(source)
    out, err, _ = api.run([str(module), "--config-file", str(ROOT / "pyproject.toml"), "--no-incremental",
                           "--cache-dir", str(tmp_path / "cache")])  # fmt: skip
    return out + err


DRIFTED = """
from rlsmoke.engine.placement import Colocated
from rlsmoke.engine.workers import Placement, TrainSide


class Drifted(Colocated):
    def sync(self, *, skip_sync: bool) -> dict[str, float]:  # the step passes skip=
        return {}


class Half:  # no rollout_weights
    trainer = None

    def weights(self, model, dtype):
        return model


def placement() -> Placement:
    return Drifted.__new__(Drifted)


def train_side() -> TrainSide:
    return Half()
"""


def test_the_type_checker_names_a_worker_off_the_interface(tmp_path):
    report = _mypy(tmp_path, DRIFTED)
    assert (
        'got "Drifted", expected "Placement"' in report and "def sync(self, *, skip_sync: bool)" in report
    ), report
    assert 'got "Half", expected "TrainSide"' in report and "protocol member:\n" in report, report
    assert report.split("protocol member:\n", 1)[1].split()[2] == "rollout_weights", report


def test_a_phased_method_moves_its_side_to_the_device_first():
    from rlsmoke.engine.workers import phased

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
