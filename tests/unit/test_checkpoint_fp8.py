"""FP8 conversion: every block dequantizes within e4m3's rounding bound; the skip list stays bf16."""

import json

import pytest
import torch

from rlsmoke.checkpoints import fp8, prune, synthesize, verify
from rlsmoke.checkpoints.quantize import BLOCK, FP8_MAX, quantize_blocks
from rlsmoke.checkpoints.shards import load_index, read_header, read_tensor

# e4m3 keeps 3 mantissa bits: round-to-nearest is within 2^-4 relative for normal values and within
# half the smallest subnormal step (2^-10 of the block scale) near zero.
REL_BOUND = 2.0**-4
SUBNORMAL_BOUND = 2.0**-10


def dequantize_blocks(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    r, c = q.shape
    s = scale_inv.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:r, :c]
    return q.float() * s


def block_error_ok(w, q, s):
    err = (dequantize_blocks(q, s) - w.float()).abs()
    scale = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[: w.shape[0], : w.shape[1]]
    bound = w.float().abs() * REL_BOUND + scale * SUBNORMAL_BOUND + 1e-30
    return bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("ue8m0", [False, True])
def test_blocks_round_trip_within_bound(ue8m0):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 260, generator=g) * torch.logspace(
        -3, 1, 260
    )  # ragged edges, blocks of different scale
    w[:128, :128] = 0  # an all-zero block must not divide by zero
    q, s = quantize_blocks(w, ue8m0=ue8m0)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (3, 3)
    assert (q.float().abs() <= FP8_MAX).all()
    ok, worst = block_error_ok(w, q, s)
    assert ok, f"worst error / bound = {worst:.3f}"
    if ue8m0:
        assert torch.equal(s, torch.exp2(torch.log2(s).round()))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    src = synthesize("glm5-744b-a40b-4layer", root / "bf16", tiny=True, max_shard_bytes=3_000_000)
    return src, fp8(src, root / "fp8", max_shard_bytes=3_000_000)


def test_checkpoint_conversion(converted):
    src, out = converted
    verify(out)
    wm_src, wm = load_index(src), load_index(out)
    quantized = [k for k in wm if k.endswith("_scale_inv")]
    assert quantized and all(k[: -len("_scale_inv")] in wm for k in quantized)
    for name in wm_src:
        e = read_header(out / wm[name])[name]
        skipped = any(s in name for s in ("norm", "embed", "mlp.gate.", "lm_head", "indexer.weights_proj"))
        if skipped or not name.endswith(".weight") or len(e.shape) != 2:
            assert name + "_scale_inv" not in wm and e.dtype == read_header(src / wm_src[name])[name].dtype, (
                name
            )
            continue
        assert e.dtype == "F8_E4M3", name
        w = read_tensor(src / wm_src[name], read_header(src / wm_src[name])[name])
        q = read_tensor(out / wm[name], e)
        s = read_tensor(
            out / wm[name + "_scale_inv"], read_header(out / wm[name + "_scale_inv"])[name + "_scale_inv"]
        )
        ok, worst = block_error_ok(w, q, s)
        assert ok, f"{name}: worst error / bound = {worst:.3f}"
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q["quant_method"] == "fp8" and q["fmt"] == "e4m3" and q["activation_scheme"] == "dynamic"
    assert q["weight_block_size"] == [128, 128] and q["scale_fmt"] == "ue8m0"  # DSA: has an indexer
    assert (
        "lm_head" in q["modules_to_not_convert"] and "model.layers.3.mlp.gate" in q["modules_to_not_convert"]
    )


def test_fp8_checkpoint_prunes_with_its_scales(converted, tmp_path):
    _, out = converted
    pruned = prune(out, tmp_path / "p", dense=1, moe=1)
    wm = load_index(pruned)
    assert "model.layers.1.mlp.experts.0.up_proj.weight_scale_inv" in wm
    assert not any(k.startswith("model.layers.2.") for k in wm)
    assert not any(
        ".layers.2." in m
        for m in json.loads((pruned / "config.json").read_text())["quantization_config"][
            "modules_to_not_convert"
        ]
    )
    verify(pruned)


def test_fp8_refuses_an_fp8_source(converted, tmp_path):
    _, out = converted
    with pytest.raises(ValueError, match="already FP8"):
        fp8(out, tmp_path / "again")
