"""GLM-5 4-layer, tiny width, trained by FSDP2 across 2 gloo ranks on CPU: the multi-GPU code path in CI."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import GateFailure, gates_for, run_case

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", num_gpus=2, tiny=True)


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step_on_two_ranks(artifacts):
    record = run_case(CASE, artifacts)
    gates_for(CASE).check(record)
    assert record.value("sync/ranks", "last") == 2


@pytest.mark.cpu
@pytest.mark.slow
def test_stale_weights_fail_the_sync_gate_on_two_ranks(artifacts):
    with pytest.raises(GateFailure, match="weight_sync: sync/mismatched_params ="):
        gates_for(CASE).check(run_case(CASE, artifacts, inject="stale-weights"))


@pytest.mark.cpu
@pytest.mark.slow
def test_train_dropout_fails_ppo_kl_on_two_ranks(artifacts):
    """Every FSDP2 rank trains with the injected dropout (the ranks build their own trainer)."""
    with pytest.raises(GateFailure, match="ppo_kl_step0: train/ppo_kl@first ="):
        gates_for(CASE).check(run_case(CASE, artifacts, inject="train-dropout=0.1"))
