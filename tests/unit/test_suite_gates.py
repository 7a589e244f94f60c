"""`gates_for(case).check(record)` on hand-written run folders: a pass, and a twin for every gate
that no engine fault reaches (the engine's faults are in each model's tests/e2e/test_*_cpu.py)."""

import json
import math

import pytest

from rlsmoke import metrics, thresholds
from rlsmoke.cases import Case
from rlsmoke.suite import Artifacts, GateFailure, HistoryBandWarning, gates_for, run_case

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
META = {"case": CASE.name, "platform": "cpu", "device": "CPU", "launcher": "builtin", "dtype": "float32/float32",
        "width": "tiny"}  # fmt: skip
STEP = {
    "train/train_rollout_logprob_abs_diff": 2e-6,
    "train/train_rollout_logprob_abs_diff_max": 2e-5,
    "train/train_rollout_kl": 4e-9,
    "train/train_rollout_logprob_slope": 3e-7,
    "train/ppo_kl": 0.0,
    "train/grad_norm": 56.0,
    "sync/mismatched_params": 0.0,
}
ROLLOUT = {"rollout/raw_reward": 0.25, "rollout/log_probs": -1.0, "rollout/rollout_log_probs": -1.0 + 3e-7}


def _run(folder, step=None, rollout=None):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [{"kind": "rollout", "index": 0, "metrics": {**ROLLOUT, **(rollout or {})}},
             {"kind": "step", "index": 0, "metrics": {**STEP, **(step or {})}}]  # fmt: skip
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (folder / "summary.json").write_text(json.dumps(META))
    return metrics.load_record(folder)


def test_a_good_run_passes_and_writes_its_summary(tmp_path):
    props = []
    art = Artifacts(tmp_path / "run", record_property=lambda k, v: props.append((k, v)))
    verdict = gates_for(CASE, art).check(_run(art.path))
    assert verdict.passed
    assert "| grad_norm |" in (art.path / "summary.md").read_text()
    assert ("gate:grad_norm", "PASS") in props


# (step or rollout override, the gate that must fail)
TWINS = [
    ({"train/grad_norm": math.nan}, None, "grad_norm: train/grad_norm@min = nan"),
    ({"train/grad_norm": 0.0}, None, "grad_norm: train/grad_norm@min = 0"),
    (None, {"rollout/raw_reward": -0.5}, "reward_min: rollout/raw_reward@min = -0.5"),
    (None, {"rollout/raw_reward": 1.5}, "reward_max: rollout/raw_reward = 1.5"),
    # derived from the two engines' sample means, as Miles' logs give them
    (None, {"rollout/rollout_log_probs": -0.9}, "logprob_mean_diff: rollout/logprob_mean_diff@absmax = -0.1"),
]


@pytest.mark.parametrize(
    ("step", "rollout", "message"), TWINS, ids=[t[2].split(":")[0] + str(i) for i, t in enumerate(TWINS)]
)
def test_record_twins_fail_their_gate(tmp_path, step, rollout, message):
    record = _run(tmp_path / "run", step, rollout)
    with pytest.raises(GateFailure) as failure:
        gates_for(CASE).check(record)
    assert message in str(failure.value)
    assert f"artifacts: {tmp_path / 'run'}" in str(failure.value)


def test_update_golden_records_a_candidate_instead_of_failing(tmp_path):
    art = Artifacts(tmp_path / "run", update_golden=True)
    verdict = gates_for(CASE, art).check(_run(art.path, {"train/grad_norm": 0.0}))
    assert not verdict.passed
    doc = json.loads((art.path / "thresholds-candidate.json").read_text())
    assert (
        doc["entries"][0]["key"]["case"] == CASE.name
        and doc["entries"][0]["provenance"]["status"] == "candidate"
    )


GQA = Case("glm4.5-355b-a32b-4layer", platform="cpu", tiny=True)


@pytest.mark.parametrize(
    ("step", "message"),
    [({"train/pg_clipfrac": 1e-3}, "pg_clipfrac_step0: train/pg_clipfrac@first = 0.001"),
     ({"train/ppo_kl": -1e-6}, "ppo_kl_step0: train/ppo_kl@first = -1e-06")],
    ids=["pg_clipfrac", "negative_ppo_kl"],
)  # fmt: skip
def test_gqa_step0_checks_are_two_sided(tmp_path, monkeypatch, step, message):
    """GLM-4.5 (no MLA) gets upstream's two-sided check_kl; the MLA models' one-sided bound lets -1e-6 by."""
    monkeypatch.setitem(META, "case", GQA.name)
    record = _run(tmp_path / "run", {"train/pg_clipfrac": 0.0, **step})
    with pytest.raises(GateFailure) as failure:
        gates_for(GQA).check(record)
    assert message in str(failure.value)
    if "ppo_kl" in step:
        monkeypatch.setitem(META, "case", CASE.name)
        assert gates_for(CASE).verdict(_run(tmp_path / "mla", step)).passed


@pytest.mark.parametrize("shadow", [False, True], ids=["gating", "shadow"])
def test_a_history_band_failure_fails_the_run_unless_shadowed(tmp_path, shadow):
    db, props = tmp_path / "h.db", []
    for i in range(3):  # trusted baseline: grad_norm 56
        art = Artifacts(tmp_path / f"good{i}", history=db, trusted=True)
        gates_for(CASE, art).check(_run(art.path))
    art = Artifacts(
        tmp_path / "pr", history=db, history_shadow=shadow, record_property=lambda k, v: props.append((k, v))
    )
    record = _run(
        art.path, {"train/grad_norm": 200.0}
    )  # inside its threshold (finite, > 0), far outside the band
    if shadow:
        with pytest.warns(HistoryBandWarning, match="train/grad_norm@0 = 200"):
            assert gates_for(CASE, art).check(record).passed
        assert dict(props)["band:train/grad_norm@0"].startswith("SHADOW FAIL train/grad_norm@0 = 200")
    else:
        with pytest.raises(GateFailure, match="train/grad_norm@0 = 200"):
            gates_for(CASE, art).check(record)
    result = "FAIL (shadow)" if shadow else "FAIL"
    assert (
        f"| `train/grad_norm@0` | 200 | [11.2, 84] | 3 | {result} |" in (art.path / "summary.md").read_text()
    )


@pytest.mark.slow
def test_a_builtin_run_is_gated_once_by_the_suite(tmp_path, monkeypatch):
    """The engine only records (in this process too); the suite's `check` is the one evaluation of the thresholds."""
    evaluated = []
    check = thresholds.Gates.check
    monkeypatch.setattr(
        thresholds.Gates,
        "check",
        lambda gates, record: evaluated.append(record.artifacts) or check(gates, record),
    )
    art = Artifacts(tmp_path / "run")
    record = run_case(CASE, art)
    summary = json.loads((art.path / "summary.json").read_text())
    assert "verdict" not in summary and "gates" not in summary, "the engine process gated the run as well"
    assert gates_for(CASE, art).check(record).passed
    assert evaluated == [str(art.path)]
    assert (
        json.loads((art.path / "summary.json").read_text())["verdict"] == "PASS"
    )  # what the session summary reads


def test_a_gpu_record_naming_no_device_is_an_error_not_a_cpu_key(tmp_path):
    """Gated from its folder alone, a GPU run's device must come from its summary: never a stand-in's CPU."""
    from rlsmoke.errors import RlsmokeError

    gpu = Case("glm5-744b-a40b-4layer-1gpu", platform="nvidia", num_gpus=1)
    _run(tmp_path / "run")
    (tmp_path / "run" / "summary.json").write_text(json.dumps({**META, "case": gpu.name, "platform": "nvidia",
                                                               "device": None}))  # fmt: skip
    with pytest.raises(RlsmokeError) as err:
        gates_for(gpu).check(metrics.load_record(tmp_path / "run"))
    assert err.value.rule == "runkey.fields"


def test_every_current_builtin_key_gates_the_logprob_slope():
    """The slope is the statistic bf16 noise cancels in (docs/calibration.md): every CPU key and every
    full-width GPU key of the built-in engine carries it. (The tiny H200 keys are from before seed 004's
    shape and are not what the GPU suite runs.)"""
    entries = [e for _, e in thresholds.read_entries(thresholds.thresholds_dirs()[-1])]
    current = [e for e in entries if e["key"].get("launcher", "").startswith("builtin")
               and (e["key"].get("device") == "CPU" or e["key"].get("width") == "full")]  # fmt: skip
    assert len(current) >= 6
    for entry in current:
        assert "logprob_slope" in {g["name"] for g in entry["gates"]}, entry["key"]
