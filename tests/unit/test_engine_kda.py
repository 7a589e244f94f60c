"""GLM-5.3-Flash's KDA path: fla's Triton kernels on a CUDA device where fla imports, transformers'
PyTorch reference elsewhere or when asked; the Triton cache next to the checkpoints; the warm-up."""

import importlib

import pytest
import torch

from rlsmoke.engine import kda
from rlsmoke.errors import RlsmokeError


def test_the_path_each_device_and_model_gets(monkeypatch):
    monkeypatch.delenv("RLSMOKE_KDA", raising=False)
    assert kda.choose("cpu", "glm5.3-flash") == "reference"
    assert kda.choose("cuda", "glm5") == ""  # no KDA layers
    monkeypatch.setattr(kda, "fla_available", lambda: True)
    assert kda.choose("cuda:0", "glm5.3-flash") == "fla"
    assert kda.choose("cpu", "glm5.3-flash") == "reference"
    monkeypatch.setenv("RLSMOKE_KDA", "reference")
    assert kda.choose("cuda:0", "glm5.3-flash") == "reference"


@pytest.mark.parametrize(
    ("asked", "fla", "device"), [("triton", True, "cuda"), ("fla", False, "cuda"), ("fla", True, "cpu")]
)
def test_a_kda_path_that_cannot_run_is_refused(monkeypatch, asked, fla, device):
    monkeypatch.setenv("RLSMOKE_KDA", asked)
    monkeypatch.setattr(kda, "fla_available", lambda: fla)
    with pytest.raises(RlsmokeError) as err:
        kda.choose(device, "glm5.3-flash")
    assert err.value.rule == "kda.path"


def test_fla_s_call_takes_only_what_fla_accepts():
    seen = {}

    def kernel(q, k, v, **kwargs):
        seen.update(kwargs)
        return q, None

    def reference(query, key, value, **kwargs):
        """the reference"""

    call = kda._fla_call(kernel, reference)
    call(1, 2, 3, g=4, beta=5, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True,
         position_ids=6, attention_mask=7)  # fmt: skip
    assert set(seen) == {"g", "beta", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel"}
    assert call.__doc__.startswith("fla.")


def test_the_reference_path_is_bound_and_the_warm_up_leaves_no_grads(monkeypatch):
    """On CPU: the layer calls transformers' PyTorch bodies; the warm-up runs forward, backward and a
    decode step at the model's widths and drops the grads it made."""
    from rlsmoke.engine.model import checkpoint_dir, load_policy
    from rlsmoke.models import model_spec

    monkeypatch.delenv("RLSMOKE_KDA", raising=False)
    case = "glm5.3-flash-4layer"
    model = load_policy(checkpoint_dir(case, tiny=True), model_spec(case, tiny=True), "float32", "cpu")
    modeling = importlib.import_module(kda.MODELING)
    chunk, recurrent = kda.KERNELS
    assert getattr(modeling, chunk) is kda._REFERENCE[chunk]
    assert kda._DECODE["kernel"] is kda._REFERENCE[recurrent]  # behind decode_step's op
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layer = next(m for m in model.modules() if type(m).__name__.endswith("LinearAttention"))
    lengths = []
    hook = layer.register_forward_pre_hook(lambda m, args, kwargs: lengths.append(
        (args[0] if args else kwargs["hidden_states"]).shape[:2]), with_kwargs=True)  # fmt: skip
    seconds = kda.warm_up([(model, True, 2), (model, False, 3)])
    hook.remove()
    assert seconds > 0
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # the rollout model generated through the whole model too: prefills at both lengths, decode steps of one token
    assert {(3, 80), (3, 96), (3, 1)} <= set(lengths), lengths


def test_the_decode_op_s_fake_shapes_are_its_kernel_s():
    """torch.library's own check of `decode_step` on the reference kernel: the fake (meta) outputs match
    the real ones, no output aliases an input, and the op survives dynamo and AOT autograd."""
    kda.install("reference")
    rows, heads, dim = 2, 2, 8
    q, k, v, g = (torch.randn(rows, 1, heads, dim) for _ in range(4))
    beta, state = torch.rand(rows, 1, heads), torch.randn(rows, heads, dim, dim)
    torch.library.opcheck(kda.decode_step, (q, k, v, -g.abs(), beta, state))
