"""metrics.py: parsing Miles logs and metrics.jsonl, gates as data, and failure reports. No torch."""

import json
import math
import subprocess
import sys

import pytest

from rlsmoke.errors import RlsmokeError
from rlsmoke.metrics import Record, load_record, parse_log_line
from rlsmoke.runkey import RunKey
from rlsmoke.thresholds import Gate, Gates, lookup_gates

MILES_LOG = """\
(MegatronTrainRayActor pid=4242) [2026-11-29 10:00:01] rollout 0: {'rollout/raw_reward': 0.25, 'rollout/log_probs': -1.2}
(MegatronTrainRayActor pid=4242) step 0: {'train/ppo_kl': 0.0, 'train/grad_norm': np.float64(3.5), 'train/train_rollout_logprob_abs_diff': 0.077, 'train/pg_clipfrac': 0}
some other line: {'not': 'metrics'}
step 1: {'train/grad_norm': nan, 'train/train_rollout_logprob_abs_diff': -inf}
rollout 1: {'rollout/log_probs': -1.0, 'rollout/rollout_log_probs': -1.05}
"""


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step 3: {'train/ppo_kl': 1e-9}", ("step", 3, {"train/ppo_kl": 1e-9})),
        (
            "prefix rollout 0: {'rollout/raw_reward': np.float32(0.5)}",
            ("rollout", 0, {"rollout/raw_reward": 0.5}),
        ),
        ("step 0: {'train/x': -nan, 'name': 'str'}", None),  # -nan parses; checked below
        ("step 0: {'train/x': __import__('os').system('true')}", None),  # never evaluated
        ("stepping 0: {}", None),
    ],
)
def test_parse_log_line(line, expected):
    got = parse_log_line(line)
    if "-nan" in line:
        assert got[0] == "step" and math.isnan(got[2]["train/x"]) and "name" not in got[2]
    else:
        assert got == expected


def test_load_record_from_miles_log(tmp_path):
    (tmp_path / "job.log").write_text(MILES_LOG)
    record = load_record(tmp_path / "job.log")
    assert record.value("train/ppo_kl", "first") == 0.0
    assert record.value("train/grad_norm", "first") == 3.5
    assert math.isnan(record.value("train/grad_norm", "max"))  # a NaN anywhere is not hidden by max()
    assert record.value("rollout/raw_reward") == 0.25
    assert record.meta["launcher"] == "miles"
    # derived where a rollout line has both engines' sample means (rollout 0 has only one)
    assert [(i, round(v, 9)) for _, i, v in record.series("rollout/logprob_mean_diff")] == [(1, 0.05)]


def test_load_record_from_run_folder(tmp_path):
    lines = [{"kind": "rollout", "index": 0, "metrics": {"rollout/raw_reward": 0.2}},
             {"kind": "rollout", "index": 1, "metrics": {"rollout/raw_reward": 0.4}},
             {"kind": "step", "index": 0, "metrics": {"train/ppo_kl": 0.0}}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "summary.json").write_text(json.dumps({"case": "c", "platform": "cpu", "device": "CPU"}))
    record = load_record(tmp_path)
    assert (record.value("rollout/raw_reward", "min"), record.value("rollout/raw_reward")) == (0.2, 0.4)
    assert record.meta == {"case": "c", "platform": "cpu", "device": "CPU"}
    assert record.artifacts == str(tmp_path)


@pytest.mark.parametrize("bad", [{"kind": "eval", "index": 0, "metrics": {}}])
def test_load_record_rejects_unknown_kind(tmp_path, bad):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(RlsmokeError, match="kind='eval'"):
        load_record(tmp_path)


def test_load_record_rejects_log_without_metrics(tmp_path):
    (tmp_path / "x.log").write_text("nothing here\n")
    with pytest.raises(RlsmokeError, match="no `step N"):
        load_record(tmp_path / "x.log")


# (op, bound, value, passed, margin)
OPS = [
    ("<", 1e-8, 0.0, True, 1e-8),
    ("<", 1e-8, 2e-8, False, -1e-8),
    ("<=", 0.0, 0.0, True, 0.0),
    (">=", 0.1, 0.05, False, -0.05),
    (">", 0.0, 0.0, False, 0.0),
    ("abs<", 1e-9, -5e-10, True, 5e-10),
    ("abs<", 1e-9, -2e-9, False, -1e-9),
    ("finite>", 0.0, 3.0, True, 3.0),
    ("finite>", 0.0, math.inf, False, math.nan),
    ("finite>", 0.0, math.nan, False, math.nan),
    ("<=", 1.0, math.nan, False, math.nan),
]


@pytest.mark.parametrize(("op", "bound", "value", "passed", "margin"), OPS)
def test_gate_ops(op, bound, value, passed, margin):
    result = Gate("g", "m", op, bound).evaluate(value)
    assert result.passed is passed
    assert (math.isnan(result.margin) and math.isnan(margin)) or result.margin == pytest.approx(margin)


def test_gate_rejects_unknown_op():
    with pytest.raises(RlsmokeError, match="op='=='"):
        Gate("g", "m", "==", 0.0)


def test_check_reports_every_failure_with_value_bound_margin_provenance_and_artifacts():
    record = Record.from_lines(
        [{"kind": "step", "index": 0, "metrics": {"a": 2.0, "b": 0.5}}], artifacts="/tmp/run7"
    )
    gates = Gates((Gate("ga", "a", "<=", 1.0, provenance="prov-a"), Gate("gb", "b", "<=", 1.0),
                   Gate("gc", "c", "<=", 1.0, provenance="prov-c")))  # fmt: skip
    verdict = gates.check(record)
    assert not verdict.passed
    assert [f.gate.name for f in verdict.failures] == ["ga", "gc"]
    report = verdict.report()
    assert "ga: a = 2, bound <= 1, margin -1" in report and "prov-a" in report
    assert "gc: c = missing" in report and "prov-c" in report
    assert "artifacts: /tmp/run7" in report
    assert "FAIL" in verdict.table() and "verdict: FAIL" in verdict.table()


def _thresholds(tmp_path, entries):
    (tmp_path / "t.json").write_text(json.dumps({"schema_version": 1, "entries": entries}))
    return tmp_path


def test_lookup_gates_picks_the_most_specific_entry(tmp_path):
    gate = {"name": "g", "metric": "m", "op": "<=", "bound": 1}
    d = _thresholds(tmp_path, [
        {"key": {"case": "c", "platform": "cpu"}, "gates": [gate | {"bound": 2}], "provenance": {"status": "wild"}},
        {"key": {"case": "c", "platform": "cpu", "device": "CPU", "dtype": "float32/float32"}, "gates": [gate],
         "provenance": {"status": "provisional", "runs": 5, "device": "CPU", "date": "2026-11-29"}},
    ])  # fmt: skip
    gates = lookup_gates(RunKey("c", "cpu"), thresholds_dir=d)
    assert [g.bound for g in gates] == [1.0]
    assert "provisional: 5 runs on CPU, 2026-11-29" in gates.gates[0].provenance
    assert [
        g.bound for g in lookup_gates(RunKey("c", "cpu", dtype="bfloat16/float32"), thresholds_dir=d)
    ] == [2.0]


def test_lookup_gates_without_an_entry_names_the_key_and_the_fix(tmp_path):
    with pytest.raises(RlsmokeError, match="no thresholds for case=zzz platform=cpu") as err:
        lookup_gates(RunKey("zzz"), thresholds_dir=_thresholds(tmp_path, []))
    assert "`rlsmoke calibrate DIR --write FILE`" in err.value.one_line()


@pytest.mark.parametrize("entry", [
    {"key": {"case": "c", "colour": "red"}, "gates": []},
    {"key": {"case": "c"}, "gates": [], "extra": 1},
])  # fmt: skip
def test_thresholds_reject_unknown_fields(tmp_path, entry):
    with pytest.raises(RlsmokeError, match="unknown fields"):
        lookup_gates(RunKey("c"), thresholds_dir=_thresholds(tmp_path, [entry]))


@pytest.mark.parametrize("case", ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer"])
def test_shipped_cpu_thresholds_have_every_gate(case):
    names = {g.name for g in lookup_gates(RunKey(case, "cpu"))}
    assert {"logprob_abs_diff", "logprob_abs_diff_max", "train_rollout_kl", "ppo_kl_step0", "grad_norm",
            "weight_sync", "reward_min", "reward_max"} <= names  # fmt: skip
    assert ("pg_clipfrac_step0" in names) is case.startswith("glm4.5")  # GQA: the two-sided Miles check_kl


def test_metrics_does_not_import_torch():
    code = (
        "import sys, rlsmoke.metrics, rlsmoke.thresholds as t; t.lookup_gates(t.RunKey('glm5-744b-a40b-4layer')); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


MILES_GQA_LOG = """\
rollout 0: {{'rollout/raw_reward': {reward}, 'rollout/log_probs': -1.0, 'rollout/rollout_log_probs': {rollout_lp}}}
step 0: {{'train/ppo_kl': {ppo_kl}, 'train/pg_clipfrac': {clipfrac}, 'train/grad_norm': {grad_norm}, 'train/train_rollout_logprob_abs_diff': {abs_diff}}}
"""
GOOD_MILES = {
    "reward": 0.25,
    "rollout_lp": -1.01,
    "ppo_kl": 0.0,
    "clipfrac": 0.0,
    "grad_norm": 3.5,
    "abs_diff": 0.04,
}

# (a value Miles logs, the gate of fixtures/thresholds/miles.json it must fail; None: it passes)
MILES_TWINS = [
    ({}, None),
    ({"rollout_lp": -0.95}, "logprob_mean_diff"),  # Miles' log-prob checker: sample means within 0.03
    ({"abs_diff": 0.2}, "logprob_abs_diff"),
    ({"ppo_kl": -1e-6}, "ppo_kl_step0"),  # two-sided for GQA
    ({"clipfrac": 0.01}, "pg_clipfrac_step0"),
    ({"grad_norm": "nan"}, "grad_norm"),
    ({"reward": 1.5}, "reward_max"),
]


@pytest.mark.parametrize(("change", "fails"), MILES_TWINS, ids=[str(f) for _, f in MILES_TWINS])
def test_miles_runs_get_upstreams_checks(tmp_path, change, fails):
    """Miles logs are gated by the constants upstream's one-step CI asserts (no run here to calibrate from)."""
    (tmp_path / "job.log").write_text(MILES_GQA_LOG.format(**{**GOOD_MILES, **change}))
    verdict = lookup_gates(RunKey("glm4.5-355b-a32b-4layer", "rocm", "MI355X", "miles")).check(
        load_record(tmp_path / "job.log")
    )
    assert [r.gate.name for r in verdict.results if not r.passed] == ([fails] if fails else [])


def test_miles_glm5_gates_follow_upstreams_mla_checks():
    mla = lookup_gates(RunKey("glm5-744b-a40b-4layer", "nvidia", "H200", "miles"))
    assert {g.name: (g.op, g.bound) for g in mla.gates}["ppo_kl_step0"] == ("<", 1e-8)
    assert "logprob_mean_diff" not in {
        g.name for g in mla.gates
    }  # GLM-5's upstream tests disable that checker
