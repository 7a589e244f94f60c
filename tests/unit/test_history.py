"""The history store and its band gate (upstream's bands), with a fault twin for each side."""

import json
import subprocess
import sys

import pytest

from rlsmoke import history, metrics, thresholds
from rlsmoke.history import BANDS, add_run, baseline, check_bands, connect
from rlsmoke.runkey import RunKey

NV = {"case": "glm5-744b-a40b-4layer", "platform": "nvidia", "device": "H200", "launcher": "miles"}
AMD = {**NV, "platform": "rocm", "device": "MI355X"}
GOOD = {
    "train/grad_norm": 1.0,
    "train/ppo_kl": 0.0,
    "train/train_rollout_logprob_abs_diff": 0.05,
    "train/train_rollout_kl": 0.01,
    "rollout/raw_reward": 0.5,
}


def _db(tmp_path, key, n=5, trusted=True, values=GOOD):
    conn = connect(tmp_path / "h.db")
    for i in range(n):
        add_run(conn, key, commit=f"c{i}", trusted=trusted, verdict="PASS", values=values)
    return conn


# (metric, value, passes): band = mean +- max(rel * |mean|, abs), around the GOOD means
BAND_CASES = [
    ("train/grad_norm", 1.49, True), ("train/grad_norm", 1.51, False),  # up 50%
    ("train/grad_norm", 0.21, True), ("train/grad_norm", 0.19, False),  # down 80%
    ("train/ppo_kl", 0.019, True), ("train/ppo_kl", 0.021, False),  # +0.02 absolute around 0
    ("train/train_rollout_logprob_abs_diff", 0.074, True), ("train/train_rollout_logprob_abs_diff", 0.076, False),
    ("train/train_rollout_kl", -0.009, True), ("train/train_rollout_kl", -0.011, False),
    ("rollout/raw_reward", 0.41, True), ("rollout/raw_reward", 0.39, False),  # down 20%
    ("rollout/raw_reward", 0.74, True), ("rollout/raw_reward", 0.76, False),  # up 50%
    ("train/grad_norm", float("nan"), False),
]  # fmt: skip


@pytest.mark.parametrize("key", [NV, AMD], ids=["nvidia", "rocm"])
@pytest.mark.parametrize(("metric", "value", "passes"), BAND_CASES)
def test_band(tmp_path, key, metric, value, passes):
    conn = _db(tmp_path, key)
    (result,) = check_bands({metric: value}, baseline(conn, key))
    assert result.passed is passes, result.line()
    assert result.runs == 5


def test_only_trusted_runs_of_the_same_key_form_the_baseline(tmp_path):
    conn = _db(tmp_path, NV, n=3)
    add_run(conn, NV, commit="bad", trusted=False, verdict="FAIL", values={**GOOD, "train/grad_norm": 100.0})
    add_run(conn, AMD, commit="amd", trusted=True, verdict="PASS", values={**GOOD, "train/grad_norm": 100.0})
    assert [r["train/grad_norm"] for r in baseline(conn, NV)] == [1.0, 1.0, 1.0]
    assert len(baseline(conn, NV, k=2)) == 2


def test_no_baseline_no_band(tmp_path):
    assert check_bands(GOOD, baseline(connect(tmp_path / "h.db"), NV)) == []


def _record(tmp_path, name, values):
    folder = tmp_path / name
    folder.mkdir()
    steps = {k: v for k, v in values.items() if k.startswith("train/")}
    lines = [{"kind": "rollout", "index": 0, "metrics": {"rollout/raw_reward": values["rollout/raw_reward"]}},
             {"kind": "step", "index": 0, "metrics": steps}]  # fmt: skip
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    (folder / "summary.json").write_text(json.dumps(NV))
    return metrics.load_record(folder)


def test_record_and_check_twin(tmp_path):
    """Trusted good runs build the baseline; a grad-norm blow-up fails the band and is not trusted."""
    db = tmp_path / "h.db"
    gates = thresholds.Gates(
        (thresholds.Gate("grad_norm", "train/grad_norm", "finite>", 0.0),), RunKey.from_summary(NV)
    )
    for i in range(3):
        rec = _record(tmp_path, f"good{i}", GOOD)
        history.record_and_check(db, rec, gates.check(rec), commit=f"c{i}", trusted=True)
    bad = _record(tmp_path, "bad", {**GOOD, "train/grad_norm": 3.0})
    results = history.record_and_check(db, bad, gates.check(bad), commit="c3", trusted=True)
    failed = [r for r in results if not r.passed]
    assert [r.metric for r in failed] == ["train/grad_norm@0"]
    assert "outside [0.2, 1.5] around the mean 1 of the last 3 trusted runs" in history.report(failed)
    assert [r["trusted"] for r in history.runs(db)] == [1, 1, 1, 0]


def _two_steps(tmp_path, name, grad_norms):
    folder = tmp_path / name
    folder.mkdir()
    lines = [
        {"kind": "step", "index": i, "metrics": {"train/grad_norm": g}} for i, g in enumerate(grad_norms)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    (folder / "summary.json").write_text(json.dumps(NV))
    return metrics.load_record(folder)


def test_each_step_is_judged_against_its_own_history(tmp_path):
    """Miles' gate since #2290: step 0 against past step 0s, step 1 against past step 1s. The twin's steps
    swap places, so the mean over steps is the same as the baseline's; only a per-step band sees it."""
    db = tmp_path / "h.db"
    gates = thresholds.Gates(
        (thresholds.Gate("grad_norm", "train/grad_norm", "finite>", 0.0),), RunKey.from_summary(NV)
    )
    for i in range(3):
        good = _two_steps(tmp_path, f"good{i}", [1.0, 10.0])
        history.record_and_check(db, good, gates.check(good), commit=f"c{i}", trusted=True)
    assert history.band_values(good) == {"train/grad_norm@0": 1.0, "train/grad_norm@1": 10.0}
    same = _two_steps(tmp_path, "same", [1.2, 9.8])
    assert all(
        r.passed for r in history.record_and_check(db, same, gates.check(same), commit="c3", trusted=False)
    )
    swapped = _two_steps(tmp_path, "swapped", [10.0, 1.0])
    results = history.record_and_check(db, swapped, gates.check(swapped), commit="c4", trusted=False)
    assert sorted(r.metric for r in results if not r.passed) == ["train/grad_norm@0", "train/grad_norm@1"]


def test_bands_are_upstreams():
    assert set(BANDS) == {"train/grad_norm", "train/ppo_kl", "train/train_rollout_logprob_abs_diff",
                          "train/train_rollout_kl", "rollout/raw_reward"}  # fmt: skip


def test_report_plots_each_gated_metric(tmp_path):
    conn = _db(tmp_path, NV, n=4)
    add_run(conn, NV, commit="c9", trusted=False, verdict="FAIL", values={**GOOD, "train/grad_norm": 3.0},
            gates=[{"name": "grad_norm", "metric": "train/grad_norm", "op": "finite>", "bound": 0.0, "value": 3.0,
                    "passed": True}])  # fmt: skip
    conn.close()
    out = tmp_path / "plots"
    proc = subprocess.run([sys.executable, "-m", "rlsmoke.cli", "report", "--history", str(tmp_path / "h.db"),
                           "--out", str(out)], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == len(BANDS)
    assert all(p.startswith("glm5-744b-a40b-4layer_nvidia_H200_miles__") for p in pngs)
    assert (out / pngs[0]).read_bytes()[:4] == b"\x89PNG"


def test_report_without_db_is_bad_input(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlsmoke.cli", "report", "--history", str(tmp_path / "none.db")],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and "history=" in proc.stderr and "does not exist" in proc.stderr
