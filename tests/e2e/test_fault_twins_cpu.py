"""Gate-can-fail twins: each engine fault (`rlsmoke run --inject`) must make its gate fail, by name.

A gate that never fails is not a gate. Gates no engine fault reaches (grad_norm, the reward range)
have record-level twins in tests/unit/test_suite_gates.py.
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import CaseRun, GateFailure, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)

# (the run, gates that must fail: "name: metric" as the failure report writes it)
TWINS = [
    (CaseRun(CASE, inject="temperature-mismatch", rollout_temperature=0.7),
     ["logprob_abs_diff: train/train_rollout_logprob_abs_diff =",
      "train_rollout_kl: train/train_rollout_kl =",
      "logprob_mean_diff: rollout/logprob_mean_diff@absmax =",
      "logprob_slope: train/train_rollout_logprob_slope@absmax ="]),
    (CaseRun(CASE, inject="stale-weights"), ["weight_sync: sync/mismatched_params ="]),
    (CaseRun(CASE, inject="rollout-noise=0.05"), ["logprob_abs_diff_max: train/train_rollout_logprob_abs_diff_max =",
                                                  "train_rollout_kl: train/train_rollout_kl ="]),
    (CaseRun(CASE, inject="train-dropout=0.1"), ["ppo_kl_step0: train/ppo_kl@first ="]),
]  # fmt: skip


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(("case_record", "expected"), TWINS, indirect=["case_record"], ids=[r.inject for r, _ in TWINS])
def test_fault_fails_its_gate(case_record, expected, artifacts):
    with pytest.raises(GateFailure) as failure:
        gates_for(CASE).check(case_record)
    inject = case_record.meta.get("inject")
    for line in expected:
        assert line in str(failure.value), f"--inject {inject} did not fail `{line}`:\n{failure.value}"
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
