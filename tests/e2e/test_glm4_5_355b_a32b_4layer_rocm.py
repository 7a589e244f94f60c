"""GLM-4.5 355B-A32B cut to 4 layers: one GRPO step on ROCm GPUs, gated by the thresholds."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import gates_for

NUM_GPUS = 8  # --num-gpus or env NUM_GPUS replaces it; every parallel size derives from it
CASE = Case("glm4.5-355b-a32b-4layer", platform="rocm", num_gpus=NUM_GPUS)


@pytest.mark.rocm
@pytest.mark.gpus(NUM_GPUS)
def test_one_step(case_record):
    gates_for(CASE).check(case_record)
