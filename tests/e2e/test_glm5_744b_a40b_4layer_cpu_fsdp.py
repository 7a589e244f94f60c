"""GLM-5 4-layer, tiny width, trained by FSDP2 across 2 gloo ranks on CPU: the multi-GPU code path in CI."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import CaseRun, GateFailure, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", num_gpus=2, tiny=True)


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step_on_two_ranks(case_record):
    gates_for(CASE).check(case_record)
    assert case_record.value("sync/ranks", "last") == 2


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "case_record", [CaseRun(CASE, inject="stale-weights")], indirect=True, ids=["stale-weights"]
)
def test_stale_weights_fail_the_sync_gate_on_two_ranks(case_record):
    with pytest.raises(GateFailure, match="weight_sync: sync/mismatched_params ="):
        gates_for(CASE).check(case_record)


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "case_record", [CaseRun(CASE, inject="train-dropout=0.1")], indirect=True, ids=["train-dropout"]
)
def test_train_dropout_fails_ppo_kl_on_two_ranks(case_record):
    """Every FSDP2 rank trains with the injected dropout (the ranks build their own trainer)."""
    with pytest.raises(GateFailure, match="ppo_kl_step0: train/ppo_kl@first ="):
        gates_for(CASE).check(case_record)
