"""bench/calibrate.py: the margin rule turns seeds into bounds, and re-calibrating keeps provenance clean."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("calibrate", Path(__file__).resolve().parents[2] / "bench" / "calibrate.py")
calibrate = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(calibrate)

SUMMARY = {"case": "c", "platform": "nvidia", "device": "H200", "launcher": "builtin", "width": "full",
           "dtype": {"rollout": "bfloat16", "train": "float32"}, "rollout_temperature": 1.0,
           "versions": {"torch": "2.11", "transformers": "5.17", "python": "3.12"}}  # fmt: skip
TEMPLATE = [
    {"name": "logprob_abs_diff", "metric": "train/train_rollout_logprob_abs_diff", "op": "<=", "bound": 1.0},
    {"name": "logprob_mean_diff", "metric": "rollout/logprob_mean_diff", "reduce": "absmax", "op": "abs<",
     "bound": 1.0},
    {"name": "ppo_kl_step0", "metric": "train/ppo_kl", "reduce": "first", "op": "<", "bound": 1e-8,
     "provenance": "3 seeds: min 0, median 0, max 0; upstream check_kl constant"},
]  # fmt: skip


def _run(folder: Path, seeds: list[tuple[float, float, float]]) -> Path:
    """A `--repeat` folder: per seed (abs diff, train mean log-prob, rollout mean log-prob)."""
    folder.mkdir()
    lines = []
    for seed, (abs_diff, train, rollout) in enumerate(seeds):
        lines += [{"kind": "rollout", "index": 0, "repeat": seed,
                   "metrics": {"rollout/log_probs": train, "rollout/rollout_log_probs": rollout}},
                  {"kind": "step", "index": 0, "repeat": seed,
                   "metrics": {"train/train_rollout_logprob_abs_diff": abs_diff, "train/ppo_kl": 0.0}}]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "summary.json").write_text(json.dumps(SUMMARY))
    return folder


def test_bounds_follow_the_margin_rule(tmp_path):
    a = _run(tmp_path / "a", [(0.10, -1.0, -0.98), (0.1234, -1.0, -1.01)])
    b = _run(tmp_path / "b", [(0.11, -1.0, -0.95)])  # mean diff -0.05: the largest magnitude
    entry, rows = calibrate.calibrate([a, b], TEMPLATE)
    bounds = {g["name"]: g["bound"] for g in entry["gates"]}
    assert bounds["logprob_abs_diff"] == 0.25  # 2 x 0.1234, rounded up to 2 significant digits
    assert bounds["logprob_mean_diff"] == pytest.approx(0.1)  # 2 x |-0.05|
    assert bounds["ppo_kl_step0"] == 1e-8  # definitional: kept
    assert entry["provenance"]["status"] == "provisional (3 runs)"
    assert entry["key"]["dtype"] == "bfloat16/float32"


def test_recalibrating_does_not_stack_seed_statistics(tmp_path):
    run = _run(tmp_path / "a", [(0.1, -1.0, -1.0)] * 10)
    entry, _ = calibrate.calibrate([run], TEMPLATE)
    again, _ = calibrate.calibrate([run], entry["gates"])  # the written entry is the next template
    (ppo,) = [g for g in again["gates"] if g["name"] == "ppo_kl_step0"]
    assert ppo["provenance"] == "10 seeds: min 0, median 0, max 0; upstream check_kl constant"
    assert again["provenance"]["status"] == "calibrated"
