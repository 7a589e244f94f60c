"""GLM-5 4-layer, tiny width, trained by FSDP2 across 2 gloo ranks on CPU: the multi-GPU code path in CI.

The one-step test and its twins take their records from one `rlsmoke run --variants` (SHARED_RUN: one
load of the two ranks; each variant the same bits as a fresh run of it at 2 gloo ranks,
tests/unit/test_run_variants.py).
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import GateFailure, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", num_gpus=2, tiny=True)
SHARED_RUN = ("clean", "stale-weights", "train-dropout=0.1")  # the clean run, then each twin's fault


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step_on_two_ranks(case_record):
    gates_for(CASE).check(case_record)
    assert case_record.value("sync/ranks", "last") == 2


@pytest.mark.cpu
@pytest.mark.slow
def test_stale_weights_fail_the_sync_gate_on_two_ranks(rlsmoke_variant_runs, artifacts):
    record = rlsmoke_variant_runs.record(CASE, artifacts, "stale-weights")
    with pytest.raises(GateFailure, match="weight_sync: sync/mismatched_params ="):
        gates_for(CASE).check(record)
    assert record.value("sync/ranks", "last") == 2


@pytest.mark.cpu
@pytest.mark.slow
def test_train_dropout_fails_ppo_kl_on_two_ranks(rlsmoke_variant_runs, artifacts):
    """Every FSDP2 rank trains with the injected dropout (the ranks build their own trainer)."""
    record = rlsmoke_variant_runs.record(CASE, artifacts, "train-dropout=0.1")
    with pytest.raises(GateFailure, match="ppo_kl_step0: train/ppo_kl@first ="):
        gates_for(CASE).check(record)
    assert record.value("sync/ranks", "last") == 2
