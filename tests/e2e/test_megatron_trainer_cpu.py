"""A GRPO step through megatron-core on CPU: tiny GLM-5 and GLM-4.5, then the bridge fault twins.

The megatron trainer (`rlsmoke run CASE --trainer megatron`) loads megatron-core's GPTModel through
the bridge, trains one step and syncs back into the HF rollout engine through the bridge. Its gates
are its own key's (launcher builtin-megatron, calibrated by `rlsmoke run CASE --platform cpu --trainer
megatron --repeat 10`). Each bridge defect round-trips exactly (the weight sync still passes) and must
fail the log-prob gate.
Skipped without megatron-core (pip install 'rlsmoke[megatron]').
"""

import dataclasses

import pytest

from rlsmoke.cases import Case
from rlsmoke.engine import megatron
from rlsmoke.suite import GateFailure, gates_for, run_case

pytestmark = [
    pytest.mark.cpu,
    pytest.mark.slow,
    pytest.mark.skipif(not megatron.available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"),
]


@pytest.fixture
def megatron_artifacts(artifacts):
    return dataclasses.replace(artifacts, trainer="megatron")


@pytest.mark.parametrize("model", ["glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer"])
def test_one_step_through_megatron_core_passes_the_gates(megatron_artifacts, model):
    case = Case(model, platform="cpu", tiny=True)
    record = run_case(case, megatron_artifacts)
    assert record.meta["launcher"] == "builtin-megatron"  # the key the gates are looked up under
    gates_for(case).check(record)
    assert record.value("sync/mismatched_params") == 0


@pytest.mark.parametrize(("model", "defect"), [
    ("glm5-744b-a40b-4layer", "bridge-kv-order"),
    ("glm5-744b-a40b-4layer", "bridge-expert-swap"),
    ("glm4.5-355b-a32b-4layer", "bridge-gate-up-order"),
])  # fmt: skip
def test_a_bridge_defect_fails_the_logprob_gate_while_the_sync_passes(megatron_artifacts, model, defect):
    case = Case(model, platform="cpu", tiny=True)
    record = run_case(case, megatron_artifacts, inject=defect)
    with pytest.raises(GateFailure) as failure:
        gates_for(case).check(record)
    assert "logprob_abs_diff: train/train_rollout_logprob_abs_diff =" in str(failure.value), failure.value
    assert "weight_sync:" not in str(failure.value)  # symmetric: a round-trip test cannot see it
    assert record.value("sync/mismatched_params") == 0
