"""GLM-5.3-Flash cut to 4 layers, tiny width: one GRPO step on the built-in engine on CPU, in every CI run.

Its slope-gate twin (a temperature mismatch) takes its records from the same `rlsmoke run --variants`
(SHARED_RUN: one load), as GLM-5's twins do in its module.
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import check_fault, gates_for

CASE = Case("glm5.3-flash-4layer", platform="cpu", tiny=True)
SHARED_RUN = ("clean", "temperature-mismatch@0.8")  # the clean run, then the twin's fault


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step(case_record):
    gates_for(CASE).check(case_record)


@pytest.mark.cpu
@pytest.mark.slow
def test_the_slope_gate_sees_a_temperature_mismatch(rlsmoke_variant_runs, artifacts):
    """The GQA and the hybrid-attention models carry the slope gate too (fixtures/thresholds)."""
    record = rlsmoke_variant_runs.record(CASE, artifacts, "temperature-mismatch@0.8")
    check_fault(CASE, record, ("logprob_slope: train/train_rollout_logprob_slope@absmax =",))
