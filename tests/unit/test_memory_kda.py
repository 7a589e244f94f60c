"""GLM-5.3-Flash's memory terms, each pinned against a measurement: the KDA layers' cache against what
transformers' cache holds after a prefill, the reference KDA's chunk temporaries against the two
reference-path peaks measured on H200s, and the one-GPU variant's estimate against its device peak
(docs/benchmarks.md, KDA memory)."""

import dataclasses

import pytest
import torch

from rlsmoke import memory
from rlsmoke.cases import Case
from rlsmoke.facts import RESIDENT_FRACTION
from rlsmoke.models import model_spec
from rlsmoke.resolve import plan_for

GIB = 2**30


def _rule(estimate_gib: float, measured_gib: float) -> bool:
    """Within 15 % of the measured peak and never more than 5 % under it."""
    return -0.05 <= (estimate_gib - measured_gib) / measured_gib <= 0.15


def _tensors(obj) -> list[torch.Tensor]:
    if torch.is_tensor(obj):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def test_the_kda_state_term_is_what_the_cache_holds():
    from rlsmoke.engine.model import checkpoint_dir, load_policy

    case, rows = "glm5.3-flash-4layer", 3
    spec = model_spec(case, tiny=True)
    model = load_policy(checkpoint_dir(case, tiny=True), spec, "bfloat16", "cpu")
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 100, (rows, 20)), use_cache=True)
    layers = [layer for layer in out.past_key_values.layers if "Linear" in type(layer).__name__]
    # the states; not a layer's scalar bookkeeping (transformers 5.25 adds an int64 cumulative length)
    held = sum(t.numel() * t.element_size() for layer in layers for t in _tensors(vars(layer)) if t.dim())
    assert len(layers) == memory.kda_layers(spec) == 3
    assert held == rows * memory._kda_state(spec, 2) * len(layers)


def test_the_kda_state_term_would_see_a_missing_state():
    """The twin: counting the recurrent state in the rollout dtype instead of float32 misses the cache."""
    spec = model_spec("glm5.3-flash-4layer", tiny=True)
    x = dict(spec.hf_extra)
    half = x["linear_num_heads"] * x["linear_head_dim"] ** 2 * 2
    assert memory._kda_state(spec, 2) - half > 0 and memory._kda_state(spec, 2) != half + 3 * 4 * 32 * 4 * 2


# Reference-path peaks (transformers' PyTorch KDA) measured on H200s at seed 004's shape, train phase.
REFERENCE_PEAKS = [
    ("glm5.3-flash-4layer-1gpu", 96, 1, False, 102.08),  # routed experts cut to 96, offload off
    ("glm5.3-flash-4layer", 288, 2, True, 109.0),  # full width, FSDP2 over two H200s, offload on
]


@pytest.mark.parametrize(("name", "experts", "gpus", "offload", "measured"), REFERENCE_PEAKS)
def test_the_reference_kda_estimate_meets_its_measured_peaks(name, experts, gpus, offload, measured):
    spec = model_spec(name).replace(num_experts=experts)
    plan = dataclasses.replace(plan_for(Case(name, platform="nvidia", num_gpus=gpus), offload=offload),
                               kda="reference")  # fmt: skip
    est = memory.estimate(spec, plan)
    assert est.peak_phase == "train"
    assert _rule(est.peak / GIB, measured), (est.gib(), measured)


@pytest.mark.parametrize(("name", "experts", "gpus", "offload", "measured"), REFERENCE_PEAKS)
def test_without_the_reference_kda_term_the_estimate_falls_short(
    name, experts, gpus, offload, measured, monkeypatch
):
    """The twin: the same estimate without the chunk temporaries is more than 5 % under one of the peaks."""
    monkeypatch.setattr(memory, "REFERENCE_KDA_TEMPORARIES", 0)
    spec = model_spec(name).replace(num_experts=experts)
    plan = dataclasses.replace(plan_for(Case(name, platform="nvidia", num_gpus=gpus), offload=offload),
                               kda="reference")  # fmt: skip
    assert (memory.estimate(spec, plan).peak / GIB - measured) / measured < -0.05


def test_the_one_gpu_variant_fits_an_h200_resident_on_either_kda_path():
    spec = model_spec("glm5.3-flash-4layer-1gpu")
    plan = plan_for(Case("glm5.3-flash-4layer-1gpu", platform="nvidia", num_gpus=1), offload=False)
    fla, ref = (
        memory.estimate(spec, dataclasses.replace(plan, kda=k)).peak / GIB for k in ("fla", "reference")
    )
    assert fla < ref < RESIDENT_FRACTION * 141  # offload stays off: the moves cost seconds a seed
    more = model_spec("glm5.3-flash-4layer-1gpu").replace(num_experts=128)
    assert (
        memory.estimate(more, dataclasses.replace(plan, kda="reference")).peak / GIB > RESIDENT_FRACTION * 141
    )
