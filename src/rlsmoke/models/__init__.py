"""Model specs and the named reductions of them that tests run (the *cases*' models)."""

from __future__ import annotations

from collections.abc import Callable

from rlsmoke.errors import require_known
from rlsmoke.models.base import ModelSpec, reduce_layers
from rlsmoke.models.glm5 import glm5_744b_a40b, glm5_tiny
from rlsmoke.models.glm5_flash import glm5_3_flash, glm5_flash_tiny
from rlsmoke.models.glm45 import glm45_355b_a32b, glm45_air, glm45_tiny

__all__ = ["ModelSpec", "MODEL_NAMES", "ONE_GPU_VARIANT", "model_spec", "reduce_layers"]

_TINY: dict[str, Callable[[ModelSpec], ModelSpec]] = {
    "glm5": glm5_tiny,
    "glm5.3-flash": glm5_flash_tiny,
    "glm4.5": glm45_tiny,
}


def _glm5_4layer_1gpu() -> ModelSpec:
    """GLM-5 4-layer at full width but its routed experts, cut 256 -> 64: AdamW's fp32 state of ~13 B
    parameters needs ~200 GB, and 64 is the largest count that fits one 141 GB H200 (96 did not)."""
    return reduce_layers(glm5_744b_a40b(), 3, 1).replace(num_experts=64, reduction="4layer-1gpu")


def _flash_4layer_1gpu() -> ModelSpec:
    """GLM-5.3-Flash 4-layer at full width but its routed experts, cut 288 -> 112: all 288 need ~168 GiB.
    At 112 the estimate is 104 GiB with offload off on fla's KDA (under the 80 % that keeps it off) and
    110 GiB on the reference KDA; 128 would leave 2 GiB of margin."""
    return reduce_layers(glm5_3_flash(), 3, 1).replace(num_experts=112, reduction="4layer-1gpu")


_MODELS: dict[str, Callable[[], ModelSpec]] = {
    "glm5-744b-a40b": glm5_744b_a40b,
    "glm5-744b-a40b-4layer": lambda: reduce_layers(glm5_744b_a40b(), 3, 1),
    "glm5-744b-a40b-4layer-1gpu": _glm5_4layer_1gpu,
    "glm5.3-flash": glm5_3_flash,
    "glm5.3-flash-4layer": lambda: reduce_layers(glm5_3_flash(), 3, 1),
    "glm5.3-flash-4layer-1gpu": _flash_4layer_1gpu,
    "glm4.5-355b-a32b": glm45_355b_a32b,
    "glm4.5-355b-a32b-4layer": lambda: reduce_layers(glm45_355b_a32b(), 3, 1),
    "glm4.5-air": glm45_air,
}
MODEL_NAMES = tuple(_MODELS)
# What a case becomes on one GPU, where its full width does not fit with fp32 master weights.
ONE_GPU_VARIANT = {name: f"{name}-1gpu" for name in ("glm5-744b-a40b-4layer", "glm5.3-flash-4layer")}


def model_spec(name: str, *, tiny: bool = False) -> ModelSpec:
    """The spec of a case's model: full width, or the `tiny` width of the same layer structure."""
    require_known("case", name, MODEL_NAMES)
    spec = _MODELS[name]().replace(name=name)
    return _TINY[spec.family](spec) if tiny else spec
