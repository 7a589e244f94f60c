"""GLM-5's DSA indexer through the bridge: HF's and megatron-core's indexers pick the same keys.

transformers' `GlmMoeDsaIndexer` applies its interleaved RoPE to the first `qk_rope_head_dim` dims of
each indexer head, megatron-core's `DSAIndexer` to the last, so the bridge moves those rows of `wq_b`,
`wk` and `k_norm` (as Miles' converter does). The dense attention of the megatron trainer never reads
the indexer, so no log-prob gate sees its layout: only the top-k does.

A case: tiny GLM-5's layer 0 indexer, the HF one from the checkpoint, the megatron-core one from the
bridge's tensors in a real GPTModel (fp32, world size 1), index_topk lowered to 8 on both so that
the top-k is a choice among 24 causal keys.
A run: the same hidden states and query latents through both; megatron-core's Hadamard rotation of q
and k needs the CUDA `fast_hadamard_transform` kernel, so this test gives it a pure-torch Hadamard
(an orthogonal map: q.k is unchanged, which is why HF can skip it).
Gates: every query with a full top-k selects the same keys; the twin maps the rows 1:1 and most
queries' selections differ. Without megatron-core: the rows move per head and round-trip.
"""

from __future__ import annotations

import pytest
import torch

from rlsmoke.bridge import convert
from rlsmoke.bridge.convert import Parallel, hf_to_megatron, megatron_to_hf
from rlsmoke.checkpoints import prepare
from rlsmoke.engine import megatron
from rlsmoke.models import model_spec

CASE_NAME = "glm5-744b-a40b-4layer"
LAYER = 0
TOPK, BATCH, SEQ = 8, 2, 24
INDEXER = f"decoder.layers.{LAYER}.self_attention.core_attention.indexer."
HF_INDEXER = f"model.layers.{LAYER}.self_attn.indexer."
needs_mcore = pytest.mark.skipif(not megatron.available(),
                                 reason="megatron-core is not installed (pip install rlsmoke[megatron])")  # fmt: skip


def _hf_state():
    from rlsmoke.engine.read import read_checkpoint

    return {k: v.float() for k, v in read_checkpoint(prepare(CASE_NAME, tiny=True), "cpu").items()}


@pytest.fixture(scope="module")
def hf_state():
    return _hf_state()


def test_the_bridge_moves_each_indexer_heads_rope_rows_last_and_back(hf_state):
    spec = model_spec(CASE_NAME, tiny=True)
    head, rope = spec.hf_extra["index_head_dim"], spec.hf_extra["qk_rope_head_dim"]
    full = hf_to_megatron(hf_state, spec)
    wq_b = hf_state[HF_INDEXER + "wq_b.weight"].reshape(
        -1, head, hf_state[HF_INDEXER + "wq_b.weight"].shape[-1]
    )
    moved = full[INDEXER + "linear_wq_b.weight"].reshape(wq_b.shape)
    assert torch.equal(moved[:, head - rope :], wq_b[:, :rope]) and torch.equal(
        moved[:, : head - rope], wq_b[:, rope:]
    )
    for mg, hf in (
        ("linear_wk.weight", "wk.weight"),
        ("k_norm.weight", "k_norm.weight"),
        ("k_norm.bias", "k_norm.bias"),
    ):
        assert torch.equal(
            full[INDEXER + mg],
            torch.cat([hf_state[HF_INDEXER + hf][rope:], hf_state[HF_INDEXER + hf][:rope]]),
        )
    back = megatron_to_hf(full, spec, hf_state)
    assert all(torch.equal(back[n], hf_state[n]) for n in hf_state)


def _hadamard(x: torch.Tensor) -> torch.Tensor:
    """fast_hadamard_transform's `hadamard_transform(x, scale=d ** -0.5)` in torch: x times the Sylvester
    Hadamard matrix of the last dim (a power of 2), scaled to be orthogonal."""
    d = x.shape[-1]
    h = torch.ones(1, 1, dtype=torch.float32)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (x.float() @ h * d**-0.5).to(x.dtype)


def _inputs(spec):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(BATCH, SEQ, spec.hidden_size, generator=g)
    q_latent = torch.randn(BATCH, SEQ, spec.hf_extra["q_lora_rank"], generator=g)
    causal = torch.full((SEQ, SEQ), float("-inf")).triu(1).expand(BATCH, SEQ, SEQ).contiguous()
    return hidden, q_latent, causal


def _hf_topk(spec, hidden, q_latent, causal):
    from rlsmoke.engine.model import load_policy

    model = load_policy(prepare(CASE_NAME, tiny=True), spec, "float32", "cpu")
    indexer = model.model.layers[LAYER].self_attn.indexer
    indexer.index_topk = TOPK
    positions = torch.arange(SEQ)[None].expand(BATCH, -1)
    with torch.no_grad():
        cos_sin = model.model.rotary_emb(hidden, position_ids=positions)
        return indexer(hidden, q_latent, cos_sin, causal, positions).long()


def _megatron_topk(rank, par, hidden, q_latent, causal, move_rope=True):
    """megatron-core's top-k, in a rank of its own (world size 1, as the colocated trainer runs): the
    pytest process holds no process group, and what this patches ends with the rank."""
    from megatron.core.transformer.experimental_attention_variant import dsa

    from rlsmoke.engine.megatron.model import build_gpt, device_shim

    dsa.rotate_activation = _hadamard
    if not move_rope:
        convert.moves_indexer_rope = lambda spec: False  # the twin: the 1:1 mapping
    spec = model_spec(CASE_NAME, tiny=True)
    gpt = build_gpt(spec, par)
    gpt.load_state_dict(hf_to_megatron(_hf_state(), spec, vocab_size=gpt.vocab_size), strict=True)
    indexer = gpt.decoder.layers[LAYER].self_attention.core_attention.indexer
    indexer.index_topk = TOPK
    with torch.no_grad(), device_shim("cpu"):
        _, topk = indexer.forward_with_scores(hidden.transpose(0, 1), q_latent.transpose(0, 1), causal)
    return topk


def _megatron_topk_in_a_rank(*inputs, move_rope=True):
    from megatron_ranks import run_ranks

    [topk] = run_ranks(_megatron_topk, Parallel(), *inputs, move_rope)
    return topk


def _selections_that_differ(hf_topk, mg_topk) -> float:
    """The fraction of queries with a full top-k (at least TOPK causal keys) whose key sets differ."""
    full = slice(TOPK - 1, SEQ)
    a, b = hf_topk[:, full].sort(-1).values, mg_topk[:, full].sort(-1).values
    return (a != b).any(-1).float().mean().item()


@needs_mcore
def test_hf_and_megatron_indexers_select_the_same_keys():
    spec = model_spec(CASE_NAME, tiny=True)
    inputs = _inputs(spec)
    assert _selections_that_differ(_hf_topk(spec, *inputs), _megatron_topk_in_a_rank(*inputs)) == 0.0


@needs_mcore
def test_twin_without_moving_the_rope_rows_selects_other_keys():
    spec = model_spec(CASE_NAME, tiny=True)
    inputs = _inputs(spec)
    assert (
        _selections_that_differ(_hf_topk(spec, *inputs), _megatron_topk_in_a_rank(*inputs, move_rope=False))
        > 0.25
    )
