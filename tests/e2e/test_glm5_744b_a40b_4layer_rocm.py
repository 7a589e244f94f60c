"""GLM-5 744B-A40B cut to 4 layers: one GRPO step on ROCm GPUs, gated by the thresholds, and its fault twins.

The one-step test and the twins take their records from one `rlsmoke run --variants` (SHARED_RUN: one
load, each variant the same bits as a fresh run of it, tests/unit/test_run_variants.py).
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import GPU_SHARED_VARIANTS, GPU_TWINS, check_fault, gates_for

NUM_GPUS = 8  # --num-gpus or env NUM_GPUS replaces it; every parallel size derives from it
CASE = Case("glm5-744b-a40b-4layer", platform="rocm", num_gpus=NUM_GPUS)
SHARED_RUN = GPU_SHARED_VARIANTS  # the clean run, then each twin's fault


@pytest.mark.rocm
@pytest.mark.gpus(NUM_GPUS)
def test_one_step(case_record):
    gates_for(CASE).check(case_record)


@pytest.mark.rocm
@pytest.mark.gpus(NUM_GPUS)
@pytest.mark.parametrize(("variant", "expected"), GPU_TWINS, ids=[v.split("@")[0] for v, _ in GPU_TWINS])
def test_fault_fails_its_gate(rlsmoke_variant_runs, artifacts, variant, expected):
    check_fault(CASE, rlsmoke_variant_runs.record(CASE, artifacts, variant), expected)
