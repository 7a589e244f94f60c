"""Gate-can-fail twins on GPUs: the faults at the GPU case's width, with a bf16 rollout.

The temperature twin samples at seed 000's 0.8 with the temperature on one side only (the trainer
scores at 0.8, the rollout engine reports its log-probs at temperature 1). bf16 noise hides that from
the mean abs diff and the signed mean diff; the log-prob slope, whose per-token noise averages out,
saw it at eight times its bound on one H200 (docs/calibration.md, the suite at seed 004's shape).
"""

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import GPU_SHARED_VARIANTS, GateFailure, SharedVariants, gates_for

NUM_GPUS = 8  # --num-gpus or env NUM_GPUS replaces it; every parallel size derives from it

# (the variant, as `rlsmoke run --variants` takes it; gates that must fail: "name: metric" as the failure
# report writes it)
TWINS = [
    ("temperature-mismatch@0.8", ["logprob_slope: train/train_rollout_logprob_slope@absmax ="]),
    ("stale-weights", ["weight_sync: sync/mismatched_params ="]),
    ("train-dropout=0.1", ["ppo_kl_step0: train/ppo_kl@first ="]),
]  # fmt: skip
# each twin is a variant of the run its model's one-step test shares
assert {variant for variant, _ in TWINS} <= set(GPU_SHARED_VARIANTS)
PLATFORMS = [("nvidia", pytest.mark.nvidia), ("rocm", pytest.mark.rocm)]
# GLM-5 (MLA + DSA) and GLM-5.3-Flash (KDA linear attention + MLA): each attention path's faults
MODELS = ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer"]
# A model's twins next to each other, so that the first of them runs all three and the others read
PARAMS = [pytest.param(platform, model, variant, expected, marks=mark,
                       id=f"{variant.split('@')[0]}-{platform}-{model}")
          for platform, mark in PLATFORMS for model in MODELS for variant, expected in TWINS]  # fmt: skip


@pytest.fixture(scope="module")
def twin_runs(rlsmoke_shared_runs):
    """Per (platform, model), the clean run and the three twins as one `rlsmoke run --variants`, shared with
    the model's one-step test (its SHARED_RUN): one load, four runs, each the same bits as a fresh run
    (tests/unit/test_run_variants.py)."""
    return SharedVariants(rlsmoke_shared_runs, GPU_SHARED_VARIANTS)


@pytest.mark.gpus(NUM_GPUS)
@pytest.mark.parametrize(("platform", "model", "variant", "expected"), PARAMS)
def test_fault_fails_its_gate(artifacts, twin_runs, platform, model, variant, expected):
    if artifacts.launcher != "builtin":
        pytest.skip(f"faults are injected into the built-in engine; this session runs --launcher {artifacts.launcher}")
    case = Case(model, platform=platform, num_gpus=NUM_GPUS)
    record = twin_runs.record(case, artifacts, variant)
    with pytest.raises(GateFailure) as failure:
        gates_for(case).check(record)
    for line in expected:
        assert line in str(failure.value), f"--variants {variant} did not fail `{line}`:\n{failure.value}"
