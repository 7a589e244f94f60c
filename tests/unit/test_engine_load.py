"""One read of the checkpoint: the compute and rollout copies are cast from the loaded master weights,
bit for bit what loading the checkpoint again in their dtype gives (the modules transformers keeps in
float32 stay so)."""

import pytest
import torch

from rlsmoke.engine.model import checkpoint_dir, derive_policy, load_policy
from rlsmoke.models import model_spec

CASES = ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def _tensors(model) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **{f"buffer:{k}": v for k, v in model.named_buffers()}}


@pytest.mark.parametrize("case", CASES)
def test_a_derived_copy_is_the_checkpoint_loaded_in_its_dtype(case):
    spec, ckpt = model_spec(case, tiny=True), checkpoint_dir(case, tiny=True)
    master = load_policy(ckpt, spec, "float32", "cpu")
    for dtype in ("bfloat16", "float32"):
        loaded, derived = (
            _tensors(load_policy(ckpt, spec, dtype, "cpu")),
            _tensors(derive_policy(master, spec, dtype)),
        )
        assert loaded.keys() == derived.keys()
        for name, t in loaded.items():
            assert derived[name].dtype == t.dtype, (dtype, name)
            assert torch.equal(_bits(derived[name]), _bits(t)), (dtype, name)


def test_a_copy_cast_from_drifted_weights_is_seen():
    """The twin: a master that moved after loading gives a copy that no longer equals the checkpoint."""
    case = "glm5-744b-a40b-4layer"
    spec, ckpt = model_spec(case, tiny=True), checkpoint_dir(case, tiny=True)
    master = load_policy(ckpt, spec, "float32", "cpu")
    with torch.no_grad():
        next(master.parameters()).mul_(1.5)
    loaded, derived = (
        _tensors(load_policy(ckpt, spec, "bfloat16", "cpu")),
        _tensors(derive_policy(master, spec, "bfloat16")),
    )
    assert any(not torch.equal(_bits(derived[n]), _bits(t)) for n, t in loaded.items())
