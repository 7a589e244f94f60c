"""GLM-5 744B-A40B cut to 4 layers, tiny width: one GRPO step on the built-in engine on CPU, in every CI run."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import CPU_SHARED_VARIANTS, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
SHARED_RUN = CPU_SHARED_VARIANTS  # this clean run is the first of its fault twins' run: one load for all


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step(case_record):
    gates_for(CASE).check(case_record)
