"""Gate-can-fail twins of the other models: GLM-5's are in its own module (one load with its one-step test).

A gate that never fails is not a gate.
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import CaseRun, GateFailure, gates_for

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
