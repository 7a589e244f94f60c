"""GLM-4.5 355B-A32B cut to 4 layers, on Miles main's own trainer: `train.py --debug-train-only` runs one
step on rlsmoke's rollout file and a torch_dist checkpoint from Miles' own converter; rlsmoke gates Miles'
logged metrics. The twin's rollout log-probs are taken at T = 1 while Miles divides by 0.8.

Needs a Miles checkout and its environment (docs/miles.md): RLSMOKE_MILES_ROOT, RLSMOKE_MEGATRON_ROOT."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASE_NAME = "glm4.5-355b-a32b-4layer"
MILES_ROOT = os.environ.get("RLSMOKE_MILES_ROOT")
MEGATRON_ROOT = os.environ.get("RLSMOKE_MEGATRON_ROOT", "/root/Megatron-LM")

pytestmark = [
    pytest.mark.nvidia,
    pytest.mark.gpus(1),
    pytest.mark.skipif(not MILES_ROOT, reason="RLSMOKE_MILES_ROOT names no Miles checkout (docs/miles.md)"),
]


def train_only(out, model_dir, *extra) -> tuple[int, dict]:
    """`rlsmoke run CASE_NAME --launcher miles --train-only ...`: its exit code and summary.json."""
    argv = [sys.executable, "-c", "import sys; from rlsmoke.cli import main; sys.exit(main())", "run", CASE_NAME,
            "--launcher", "miles", "--train-only", "--miles-root", MILES_ROOT, "--megatron-root", MEGATRON_ROOT,
            "--platform", "nvidia", "--num-gpus", "1", "--model-dir", str(model_dir), "--out", str(out), *extra]  # fmt: skip
    done = subprocess.run(argv, timeout=3600)
    summary = out / "summary.json"
    return done.returncode, json.loads(summary.read_text()) if summary.is_file() else {}


def gate(summary: dict, name: str) -> dict:
    return next(g for g in summary["gates"] if g["name"] == name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The HF and torch_dist checkpoints, shared by both runs (and kept in RLSMOKE_MILES_MODELS when set)."""
    kept = os.environ.get("RLSMOKE_MILES_MODELS")
    return Path(kept) if kept else tmp_path_factory.mktemp("miles-models")


def test_one_step_on_miles_trainer(tmp_path, model_dir):
    code, summary = train_only(tmp_path / "clean", model_dir)
    assert code == 0, summary.get("gates")
    assert gate(summary, "logprob_abs_diff")["passed"] and gate(summary, "grad_norm")["passed"]
    assert (
        model_dir / f"{CASE_NAME}_torch_dist" / "latest_checkpointed_iteration.txt"
    ).read_text().strip() == "release"


def test_twin_rollout_temperature_trips_the_logprob_gate(tmp_path, model_dir):
    code, summary = train_only(
        tmp_path / "twin", model_dir, "--rollout-temperature", "0.8", "--inject", "temperature-mismatch"
    )
    assert code == 1, summary.get("gates")
    assert not gate(summary, "logprob_abs_diff")["passed"]
