"""`rlsmoke run --repeat K` judges every seed: one seed over a bound fails the run, and the table and
summary.json show each gate's worst seed while `per_repeat` keeps every seed's values.

A real two-seed run measures both seeds; a thresholds folder (RLSMOKE_THRESHOLDS_DIR) then puts one
bound between them, so that only seed 0 exceeds it: the seed a last-seed-wins merge would hide.
"""

import json
import os
import sys

import pytest
from procs import run_cli

from rlsmoke import metrics, thresholds
from rlsmoke.cli import main
from rlsmoke.errors import ExitCode, RlsmokeError

CASE = "glm5-744b-a40b-4layer"
KEY = {"case": CASE, "platform": "cpu", "device": "CPU", "launcher": "builtin", "dtype": "float32/float32",
       "width": "tiny"}  # fmt: skip


def _argv(out) -> list[str]:
    return ["run", CASE, "--platform", "cpu", "--repeat", "2", "--out", str(out)]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("two-seeds")
    assert main(_argv(out)) == ExitCode.OK
    return out, json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def failing_seed_0(measured, tmp_path_factory):
    """The shipped entry with one upper bound halfway between seed 0's value and seed 1's lower one."""
    tmp_path = tmp_path_factory.mktemp("seed-0-fails")
    _, summary = measured
    first, last = summary["per_repeat"]
    _, entry = thresholds.matching_entry(KEY, thresholds.THRESHOLDS_DIR)
    upper = [g for g in entry["gates"] if g["op"] == "<=" and first[_key(g)] > last[_key(g)]]
    assert upper, f"seed 0 is not worse than seed 1 on any upper bound: {summary['per_repeat']}"
    gate = max(upper, key=lambda g: first[_key(g)] / last[_key(g)])  # the widest gap between the seeds
    gate["bound"] = (first[_key(gate)] + last[_key(gate)]) / 2
    (tmp_path / "thresholds").mkdir()
    doc = {"schema_version": thresholds.SCHEMA_VERSION, "entries": [entry]}
    (tmp_path / "thresholds" / "one-bound-between-seeds.json").write_text(json.dumps(doc))
    out = tmp_path / "run"
    env = os.environ | {"RLSMOKE_THRESHOLDS_DIR": str(tmp_path / "thresholds")}
    argv = [sys.executable, "-m", "rlsmoke.cli", *_argv(out)]
    proc = run_cli(argv, env=env, timeout=300)  # in this process: the thresholds folder is read at run time
    return proc.returncode, gate, first, last, json.loads((out / "summary.json").read_text()), proc


def _key(gate: dict) -> str:
    return gate["metric"] if gate.get("reduce", "max") == "max" else f"{gate['metric']}@{gate['reduce']}"


def test_one_failing_seed_fails_the_run(failing_seed_0):
    rc, gate, _, _, summary, printed = failing_seed_0
    assert rc == ExitCode.GATE_FAILED, printed.stdout + printed.stderr
    assert summary["verdict"] == "FAIL"
    assert (summary["seeds"], summary["failed_seeds"]) == ([0, 1], [0])
    assert summary["per_repeat_verdict"] == ["FAIL", "PASS"]
    failed = [g for g in summary["gates"] if not g["passed"]]
    assert [(g["name"], g["seed"], g["failing_seeds"]) for g in failed] == [(gate["name"], 0, [0])]


def test_summary_shows_each_gates_worst_seed_and_keeps_every_seed(failing_seed_0, measured):
    _, gate, first, last, summary, _ = failing_seed_0
    assert summary["per_repeat"] == measured[1]["per_repeat"]  # the same seeds give the same values
    assert summary["metrics"][_key(gate)] == first[_key(gate)]  # the failing seed's, not the last seed's
    worse_of = {"<=": max, "<": max, ">=": min, "finite>": min, "abs<": lambda a, b: max(a, b, key=abs)}
    for g in summary["gates"]:
        k = _key(g)
        worse = worse_of[g["op"]]
        assert summary["metrics"][k] == worse(first[k], last[k]), k
        assert (first, last)[g["seed"]][k] == summary["metrics"][k]


def test_table_names_the_worst_seed_of_each_gate(failing_seed_0):
    _, gate, first, _, summary, printed = failing_seed_0
    rows = {line.split()[0]: line for line in printed.stdout.splitlines() if line and line.split()[0] in
            {g["name"] for g in summary["gates"]}}  # fmt: skip
    assert set(rows) == {g["name"] for g in summary["gates"]}
    row = rows[gate["name"]].split()
    assert row[2:4] == [f"{first[_key(gate)]:.4g}", "0"] and row[-3:] == ["FAIL", "(seed", "0)"]
    for g in summary["gates"]:
        assert rows[g["name"]].split()[3] == str(g["seed"])
    assert "verdict: FAIL over 2 seeds (0, 1); failed: seed 0" in printed.stdout
    assert "seed 0, the worst of 2; failing seeds: 0" in printed.stderr  # the failure report names it too


def test_the_seeds_of_a_repeat_run_make_no_single_record(measured):
    out, _ = measured
    with pytest.raises(RlsmokeError) as err:
        metrics.load_record(out)
    assert err.value.rule == "metrics.one_seed"


def test_a_one_device_run_calibrates_into_a_count_free_entry(measured, tmp_path, capsys):
    """The engine's own summary (one device: num_gpus "*") goes through `rlsmoke calibrate` as it is."""
    out, _ = measured
    target = tmp_path / "cal.json"
    assert main(["calibrate", str(out), "--write", str(target)]) == ExitCode.OK
    (entry,) = json.loads(target.read_text())["entries"]
    assert entry["key"]["num_gpus"] == "*" and entry["provenance"]["runs"] == 2
    assert entry["provenance"]["command"] == f"rlsmoke run {CASE} --platform cpu --repeat 2"


def test_recalibrating_replaces_an_entry_written_before_keys_had_a_count(measured, tmp_path):
    """An entry whose key has no num_gpus is the same one-device key: recalibrating replaces it, and
    the new bounds are the ones looked up (kept side by side, the older entry won the tie)."""
    from rlsmoke.runkey import RunKey
    from rlsmoke.thresholds import lookup_gates

    out, _ = measured
    target = tmp_path / "cal.json"
    assert main(["calibrate", str(out), "--write", str(target)]) == ExitCode.OK
    doc = json.loads(target.read_text())
    (fresh,) = doc["entries"]
    stale = json.loads(json.dumps(fresh))
    del stale["key"]["num_gpus"]
    for gate in stale["gates"]:
        if gate["name"] == "logprob_abs_diff":  # a calibrated gate: the definitional ones keep their bounds
            gate["bound"] = 12345.0
    doc["entries"] = [stale]
    target.write_text(json.dumps(doc))
    assert main(["calibrate", str(out), "--write", str(target)]) == ExitCode.OK
    (entry,) = json.loads(target.read_text())["entries"]
    assert entry["key"]["num_gpus"] == "*"
    key = RunKey.from_summary(json.loads((out / "summary.json").read_text()))
    bounds = {g.name: g.bound for g in lookup_gates(key, thresholds_dir=tmp_path).gates}
    assert bounds["logprob_abs_diff"] == next(
        g["bound"] for g in fresh["gates"] if g["name"] == "logprob_abs_diff"
    )
