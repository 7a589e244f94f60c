"""The megatron trainer's routed experts, grouped: the same bits as megatron-core's `SequentialMLP`.

A case: tiny GLM-5's MoE layer as the megatron trainer builds it (16 routed experts, SwiGLU), in fp32 and
in bf16, fed tokens routed unevenly with some experts given none.
A run: the layer's `GroupedExperts.forward` (one grouped GEMM per projection) and `SequentialMLP.forward`
on the same module, inputs and probs, each then backward from the same output gradient.
Gates: outputs, the input's and the probs' gradients and every expert weight's gradient are bit-equal;
the model's experts are `GroupedExperts` on the grouped path. Twin: tokens counted against the wrong
experts (one count moved) must break the equality, so the comparison can see a misrouted group.
"""

from __future__ import annotations

import pytest
import torch

from rlsmoke.engine import megatron

pytestmark = [
    pytest.mark.cpu,
    pytest.mark.skipif(
        not megatron.available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"
    ),
]

CASE_NAME = "glm5-744b-a40b-4layer"


def _grouped_against_sequential(rank, par, dtype_name: str, misroute: bool):
    """In a rank of its own (megatron-core's groups): what differs between the two forwards and backwards."""
    from megatron.core.transformer.moe.experts import SequentialMLP

    from rlsmoke.engine.megatron.experts import why_sequential
    from rlsmoke.engine.megatron.model import build_gpt
    from rlsmoke.models import model_spec

    dtype = getattr(torch, dtype_name)
    gpt = build_gpt(model_spec(CASE_NAME, tiny=True), par, params_dtype=dtype)
    [experts] = [m for m in gpt.modules() if isinstance(m, SequentialMLP)]
    generator = torch.Generator().manual_seed(0)
    for p in experts.parameters():
        p.data = torch.randn(p.shape, generator=generator).to(dtype) * 0.05
    n = experts.num_local_experts
    counts = torch.randint(0, 7, (n,), generator=generator)
    counts[[1, n // 2]] = 0  # experts no token reached
    hidden = torch.randn(int(counts.sum()), gpt.config.hidden_size, generator=generator).to(dtype)
    probs = torch.rand(hidden.shape[0], generator=generator)  # the router's fp32 probs
    grad_out = torch.randn(hidden.shape, generator=generator).to(dtype)

    def run(forward, tokens_per_expert):
        x, p = hidden.clone().requires_grad_(), probs.clone().requires_grad_()
        experts.zero_grad(set_to_none=True)
        out, bias = forward(experts, x, tokens_per_expert, p)
        out.backward(grad_out)
        grads = {name: w.grad.clone() for name, w in experts.named_parameters()}
        return out.detach(), bias, x.grad, p.grad, grads

    moved = counts.clone()
    if misroute:  # one token counted against the next expert
        first = int(torch.nonzero(moved)[0])
        moved[first] -= 1
        moved[first + 1] += 1
    grouped = run(type(experts).forward, moved)
    sequential = run(SequentialMLP.forward, counts)
    named = ("output", "bias", "input grad", "probs grad")
    differs = [name for name, a, b in zip(named, grouped[:4], sequential[:4], strict=True)
               if not (a is None and b is None or torch.equal(a, b))]  # fmt: skip
    differs += [name for name, g in grouped[4].items() if not torch.equal(g, sequential[4][name])]
    return {"class": type(experts).__name__, "why_sequential": why_sequential(experts.config, hidden, experts.local_experts[0]),
            "experts": n, "empty": int((counts == 0).sum()), "differs": differs}  # fmt: skip


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_grouped_experts_are_sequential_mlps_bits(dtype_name):
    from megatron_ranks import run_ranks

    from rlsmoke.bridge.convert import Parallel

    [got] = run_ranks(_grouped_against_sequential, Parallel(), dtype_name, False)
    assert got["class"] == "GroupedExperts" and got["why_sequential"] is None, got
    assert got["experts"] >= 8 and got["empty"] >= 2, got
    assert got["differs"] == [], got


def test_a_misrouted_token_breaks_the_equality():
    from megatron_ranks import run_ranks

    from rlsmoke.bridge.convert import Parallel

    [got] = run_ranks(_grouped_against_sequential, Parallel(), "float32", True)
    assert {"output", "input grad"} <= set(got["differs"]), got
