"""Gate-can-fail twins: each engine fault (`rlsmoke run --inject`) must make its gate fail, by name.

A gate that never fails is not a gate. Gates no engine fault reaches (grad_norm, the reward range)
have record-level twins in tests/unit/test_suite_gates.py.
"""

import json

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import CPU_SHARED_VARIANTS, CaseRun, GateFailure, SharedVariants, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)

# (the variant, as `rlsmoke run --variants` takes it; gates that must fail: "name: metric" as the failure
# report writes it)
TWINS = [
    ("temperature-mismatch@0.7",
     ["logprob_abs_diff: train/train_rollout_logprob_abs_diff =",
      "train_rollout_kl: train/train_rollout_kl =",
      "logprob_mean_diff: rollout/logprob_mean_diff@absmax =",
      "logprob_slope: train/train_rollout_logprob_slope@absmax ="]),
    ("stale-weights", ["weight_sync: sync/mismatched_params ="]),
    ("rollout-noise=0.05", ["logprob_abs_diff_max: train/train_rollout_logprob_abs_diff_max =",
                            "train_rollout_kl: train/train_rollout_kl ="]),
    ("train-dropout=0.1", ["ppo_kl_step0: train/ppo_kl@first ="]),
]  # fmt: skip


assert {variant for variant, _ in TWINS} <= set(CPU_SHARED_VARIANTS)


@pytest.fixture(scope="module")
def twin_runs(rlsmoke_shared_runs):
    """The clean run and the four twins as one `rlsmoke run --variants`, shared with GLM-5's CPU one-step
    test (its SHARED_RUN): one load, each run the same bits as a fresh run (tests/unit/test_run_variants.py)."""
    return SharedVariants(rlsmoke_shared_runs, CPU_SHARED_VARIANTS)


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(("variant", "expected"), TWINS, ids=[v.split("@")[0] for v, _ in TWINS])
def test_fault_fails_its_gate(twin_runs, variant, expected, artifacts):
    record = twin_runs.record(CASE, artifacts, variant)
    with pytest.raises(GateFailure) as failure:
        gates_for(CASE).check(record)
    assert json.loads((artifacts.path / "summary.json").read_text())["inject"] == variant.split("@")[0]  # its own run
    for line in expected:
        assert line in str(failure.value), f"--variants {variant} did not fail `{line}`:\n{failure.value}"
    assert f"artifacts: {artifacts.path}" in str(failure.value)


SLOPE_TWINS = [CaseRun(Case(model, platform="cpu", tiny=True), inject="temperature-mismatch", rollout_temperature=0.8)
               for model in ("glm4.5-355b-a32b-4layer", "glm5.3-flash-4layer")]  # fmt: skip


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize("case_record", SLOPE_TWINS, indirect=True, ids=[r.case.name for r in SLOPE_TWINS])
def test_every_model_s_slope_gate_sees_a_temperature_mismatch(case_record):
    """The GQA and the hybrid-attention models carry the slope gate too (fixtures/thresholds)."""
    with pytest.raises(GateFailure) as failure:
        gates_for(case_record.case).check(case_record)
    assert "logprob_slope: train/train_rollout_logprob_slope@absmax =" in str(failure.value)
