"""`rlsmoke calibrate`: the margin rule turns seeds into bounds, a cluster's file wins over the shipped one."""

import json
from pathlib import Path

import pytest

from rlsmoke import calibration, metrics, thresholds
from rlsmoke.cli import main
from rlsmoke.errors import ExitCode
from rlsmoke.runkey import RunKey

CPU_KEY = {"case": "glm5-744b-a40b-4layer", "platform": "cpu", "device": "CPU", "launcher": "builtin",
           "width": "tiny", "dtype": {"rollout": "float32", "train": "float32"}}  # fmt: skip
TEMPLATE = [
    {"name": "logprob_abs_diff", "metric": "train/train_rollout_logprob_abs_diff", "op": "<=", "bound": 1.0},
    {"name": "logprob_mean_diff", "metric": "rollout/logprob_mean_diff", "reduce": "absmax", "op": "abs<",
     "bound": 1.0},
    {"name": "ppo_kl_step0", "metric": "train/ppo_kl", "reduce": "first", "op": "<", "bound": 1e-8,
     "provenance": "3 seeds: min 0, median 0, max 0; upstream check_kl constant"},
]  # fmt: skip


def _repeat_run(folder: Path, seeds: list[tuple[float, float, float]], summary=CPU_KEY) -> Path:
    """A `rlsmoke run --repeat` folder: per seed (abs diff, train mean log-prob, rollout mean log-prob)."""
    folder.mkdir()
    lines = []
    for seed, (abs_diff, train, rollout) in enumerate(seeds):
        lines += [{"kind": "rollout", "index": 0, "repeat": seed,
                   "metrics": {"rollout/log_probs": train, "rollout/rollout_log_probs": rollout}},
                  {"kind": "step", "index": 0, "repeat": seed,
                   "metrics": {"train/train_rollout_logprob_abs_diff": abs_diff, "train/ppo_kl": 0.0}}]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "summary.json").write_text(json.dumps({**summary, "versions": {"torch": "2.13"}}))
    return folder


def test_bounds_follow_the_margin_rule(tmp_path):
    a = _repeat_run(tmp_path / "a", [(0.10, -1.0, -0.98), (0.1234, -1.0, -1.01)])
    b = _repeat_run(tmp_path / "b", [(0.11, -1.0, -0.95)])  # mean diff -0.05: the largest magnitude
    entry, _ = calibration.calibrate([a, b], TEMPLATE)
    bounds = {g["name"]: g["bound"] for g in entry["gates"]}
    assert bounds == {"logprob_abs_diff": 0.25,  # 2 x 0.1234, rounded up to 2 significant digits
                      "logprob_mean_diff": 0.1,  # 2 x |-0.05| (not 0.11: float noise does not round up)
                      "ppo_kl_step0": 1e-8}  # definitional: kept  # fmt: skip
    assert entry["provenance"]["status"] == "provisional (3 runs)"
    assert entry["key"]["dtype"] == "float32/float32"
    assert "rollout_decode" not in entry["provenance"]  # an older summary names none


def test_the_entry_names_the_decode_its_runs_sampled_with(tmp_path):
    static = {**CPU_KEY, "rollout_decode": {"asked": "auto", "ran": ["static"], "fallback": None}}
    entry, _ = calibration.calibrate([_repeat_run(tmp_path / "a", [(0.1, -1.0, -1.0)] * 2, static)], TEMPLATE)
    assert entry["provenance"]["rollout_decode"] == "static"


def test_recalibrating_does_not_stack_seed_statistics(tmp_path):
    run = _repeat_run(tmp_path / "a", [(0.1, -1.0, -1.0)] * 10)
    entry, _ = calibration.calibrate([run], TEMPLATE)
    again, _ = calibration.calibrate([run], entry["gates"])  # the written entry is the next template
    (ppo,) = [g for g in again["gates"] if g["name"] == "ppo_kl_step0"]
    assert ppo["provenance"] == "10 seeds: min 0, median 0, max 0; upstream check_kl constant"
    assert again["provenance"]["status"] == "calibrated"


def test_a_clusters_calibration_wins_over_the_shipped_entry(tmp_path, monkeypatch, capsys):
    run = _repeat_run(tmp_path / "run", [(3e-6, -1.0, -1.0 + 1e-6)] * 10)
    ours = tmp_path / "ours" / "cluster.json"
    assert main(["calibrate", str(run), "--write", str(ours)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert (
        "| logprob_abs_diff | `train/train_rollout_logprob_abs_diff` | 3e-06 | 3e-06 | 3e-06 | <= 6e-06 |"
        in out
    )
    assert (
        "Not gated: logprob_abs_diff_max, train_rollout_kl, logprob_slope, grad_norm, weight_sync, reward_min, "
        "reward_max"
    ) in out
    shipped = thresholds.lookup_gates(RunKey("glm5-744b-a40b-4layer"))
    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(ours.parent))
    gates = thresholds.lookup_gates(RunKey("glm5-744b-a40b-4layer"))
    assert gates.source == str(ours) != shipped.source
    # the shipped entry's gates, measured again: those these runs logged
    assert [g.name for g in gates.gates] == ["logprob_abs_diff", "logprob_mean_diff", "ppo_kl_step0"]


def test_miles_runs_calibrate_from_their_logs(tmp_path):
    """A suite run through Miles leaves run.log and summary.json: one seed each, gated by miles.json."""
    runs = []
    for seed, shift in enumerate((0.01, -0.02, 0.015)):
        folder = tmp_path / f"nightly{seed}"
        folder.mkdir()
        (folder / "run.log").write_text(
            f"rollout 0: {{'rollout/raw_reward': 0.3, 'rollout/log_probs': -0.5, 'rollout/rollout_log_probs': {-0.5 + shift}}}\n"
            "step 0: {'train/ppo_kl': 0.0, 'train/pg_clipfrac': 0.0, 'train/grad_norm': 2.0, "
            "'train/train_rollout_logprob_abs_diff': 0.05}\n")  # fmt: skip
        (folder / "summary.json").write_text(json.dumps({"case": "glm4.5-355b-a32b-4layer", "platform": "rocm",
            "device": "MI355X", "launcher": "miles", "dtype": "bfloat16/float32", "width": "full"}))  # fmt: skip
        runs.append(folder)
    (entry,) = calibration.run(runs)
    bounds = {g["name"]: (g["op"], g["bound"]) for g in entry["gates"]}
    assert bounds["logprob_mean_diff"] == ("abs<", 0.04)  # 2 x 0.02, in place of upstream's 0.03
    assert bounds["logprob_abs_diff"] == ("<=", 0.1)
    assert bounds["pg_clipfrac_step0"] == ("abs<", 1e-10)  # GLM-4.5's two-sided check_kl, kept
    assert (
        entry["provenance"]["command"] == "3 suite runs of glm4.5-355b-a32b-4layer on rocm (--launcher miles)"
    )


@pytest.mark.parametrize(("argv", "rule"), [
    (["calibrate", "{tmp}/nowhere"], "calibrate.run"),
    (["calibrate", "{tmp}"], "calibrate.summary"),
])  # fmt: skip
def test_bad_input_is_one_error_line(tmp_path, capsys, argv, rule):
    assert main([a.format(tmp=tmp_path) for a in argv]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"[{rule}]" in err and "Traceback" not in err


def test_a_missing_thresholds_dir_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(tmp_path / "missing"))
    with pytest.raises(metrics.RlsmokeError, match="RLSMOKE_THRESHOLDS_DIR="):
        thresholds.lookup_gates(RunKey("glm5-744b-a40b-4layer"))


def test_a_target_that_is_not_a_thresholds_file_is_left_as_it_was(tmp_path, capsys):
    run = _repeat_run(tmp_path / "run", [(3e-6, -1.0, -1.0)])
    target = tmp_path / "notes.json"
    target.write_text("my notes, not JSON")
    assert main(["calibrate", str(run), "--write", str(target)]) == ExitCode.USAGE
    assert "[thresholds.schema]" in capsys.readouterr().err
    assert target.read_text() == "my notes, not JSON"


def test_a_new_device_takes_the_gates_of_its_case(tmp_path):
    h100 = {**CPU_KEY, "case": "glm5-744b-a40b-4layer-1gpu", "platform": "nvidia", "device": "H100",
            "width": "full", "dtype": {"rollout": "bfloat16", "train": "float32"}}  # fmt: skip
    (entry,) = calibration.run([_repeat_run(tmp_path / "h100", [(0.1, -1.0, -0.97)], summary=h100)])
    assert entry["key"]["device"] == "H100"
    assert [g["name"] for g in entry["gates"]] == ["logprob_abs_diff", "logprob_mean_diff", "ppo_kl_step0"]
    assert {g["name"]: g["bound"] for g in entry["gates"]}["logprob_mean_diff"] == 0.06
    with pytest.raises(metrics.RlsmokeError, match="no thresholds entry matches case=no-such-case") as err:
        calibration.template_for(RunKey.from_summary({**entry["key"], "case": "no-such-case"}), [])
    assert err.value.rule == "calibrate.template"
