"""GLM-5 744B-A40B cut to 4 layers: one GRPO step on ROCm GPUs, gated by the thresholds."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import GPU_SHARED_VARIANTS, gates_for

NUM_GPUS = 8  # --num-gpus or env NUM_GPUS replaces it; every parallel size derives from it
CASE = Case("glm5-744b-a40b-4layer", platform="rocm", num_gpus=NUM_GPUS)
SHARED_RUN = GPU_SHARED_VARIANTS  # this clean run is the first of its fault twins' run: one load for all


@pytest.mark.rocm
@pytest.mark.gpus(NUM_GPUS)
def test_one_step(case_record):
    gates_for(CASE).check(case_record)
