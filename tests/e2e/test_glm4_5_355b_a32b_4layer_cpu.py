"""GLM-4.5 355B-A32B cut to 4 layers, tiny width: one GRPO step on the built-in engine on CPU, in every CI run."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import gates_for

CASE = Case("glm4.5-355b-a32b-4layer", platform="cpu", tiny=True)


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step(case_record):
    gates_for(CASE).check(case_record)
