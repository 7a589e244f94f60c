"""A GRPO step through megatron-core on CPU: tiny GLM-5 and GLM-4.5, then the bridge fault twins.

The megatron trainer (`rlsmoke run CASE --trainer megatron`) loads megatron-core's GPTModel through
the bridge, trains one step and syncs back into the HF rollout engine through the bridge. Its gates
are its own key's (launcher builtin-megatron, calibrated by `rlsmoke run CASE --platform cpu --trainer
megatron --repeat 10`). Each bridge defect round-trips exactly (the weight sync still passes) and must
fail the log-prob gate.
Skipped without megatron-core (pip install 'rlsmoke[megatron]').
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.engine import megatron
from rlsmoke.suite import CaseRun, GateFailure, gates_for

pytestmark = [
    pytest.mark.cpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not megatron.available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"
    ),
]

GLM5 = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
GLM4_5 = Case("glm4.5-355b-a32b-4layer", platform="cpu", tiny=True)
STEPS = [CaseRun(GLM5, trainer="megatron"), CaseRun(GLM4_5, trainer="megatron")]
DEFECTS = [CaseRun(GLM5, inject="bridge-kv-order", trainer="megatron"),
           CaseRun(GLM5, inject="bridge-expert-swap", trainer="megatron"),
           CaseRun(GLM4_5, inject="bridge-gate-up-order", trainer="megatron")]  # fmt: skip


@pytest.mark.parametrize("case_record", STEPS, indirect=True, ids=[r.case.name for r in STEPS])
def test_one_step_through_megatron_core_passes_the_gates(case_record):
    assert case_record.meta["launcher"] == "builtin-megatron"  # the key the gates are looked up under
    gates_for(case_record.case).check(case_record)
    assert case_record.value("sync/mismatched_params") == 0


@pytest.mark.parametrize(
    "case_record", DEFECTS, indirect=True, ids=[f"{r.case.name}-{r.inject}" for r in DEFECTS]
)
def test_a_bridge_defect_fails_the_logprob_gate_while_the_sync_passes(case_record):
    with pytest.raises(GateFailure) as failure:
        gates_for(case_record.case).check(case_record)
    assert "logprob_abs_diff: train/train_rollout_logprob_abs_diff =" in str(failure.value), failure.value
    assert "weight_sync:" not in str(failure.value)  # symmetric: a round-trip test cannot see it
    assert case_record.value("sync/mismatched_params") == 0
