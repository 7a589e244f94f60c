"""Gate-can-fail twins: each engine fault (`rlsmoke run --inject`) must make its gate fail, by name.

A gate that never fails is not a gate. Gates no engine fault reaches (grad_norm, the reward range)
have record-level twins in tests/unit/test_suite_gates.py.
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import GateFailure, gates_for, run_case

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)

# (inject, rollout temperature, gates that must fail: "name: metric" as the failure report writes it)
TWINS = [
    ("temperature-mismatch", 0.7, ["logprob_abs_diff: train/train_rollout_logprob_abs_diff =",
                                   "train_rollout_kl: train/train_rollout_kl =",
                                   "logprob_mean_diff: rollout/logprob_mean_diff@absmax =",
                                   "logprob_slope: train/train_rollout_logprob_slope@absmax ="]),
    ("stale-weights", None, ["weight_sync: sync/mismatched_params ="]),
    ("rollout-noise=0.05", None, ["logprob_abs_diff_max: train/train_rollout_logprob_abs_diff_max =",
                                  "train_rollout_kl: train/train_rollout_kl ="]),
    ("train-dropout=0.1", None, ["ppo_kl_step0: train/ppo_kl@first ="]),
]  # fmt: skip


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(("inject", "temperature", "expected"), TWINS, ids=[t[0] for t in TWINS])
def test_fault_fails_its_gate(artifacts, inject, temperature, expected):
    record = run_case(CASE, artifacts, inject=inject, rollout_temperature=temperature)
    with pytest.raises(GateFailure) as failure:
        gates_for(CASE).check(record)
    for line in expected:
        assert line in str(failure.value), f"--inject {inject} did not fail `{line}`:\n{failure.value}"
    assert f"artifacts: {artifacts.path}" in str(failure.value)


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize("model", ["glm4.5-355b-a32b-4layer", "glm5.3-flash-4layer"])
def test_every_model_s_slope_gate_sees_a_temperature_mismatch(artifacts, model):
    """The GQA and the hybrid-attention models carry the slope gate too (fixtures/thresholds)."""
    case = Case(model, platform="cpu", tiny=True)
    record = run_case(case, artifacts, inject="temperature-mismatch", rollout_temperature=0.8)
    with pytest.raises(GateFailure) as failure:
        gates_for(case).check(record)
    assert "logprob_slope: train/train_rollout_logprob_slope@absmax =" in str(failure.value)
