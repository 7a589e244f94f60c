"""prune(synth 8 layers) == synth(4 layers), tensor for tensor; MTP layers; asking for too much."""

import json

import pytest
import torch
from checkpoint_bytes import raw_tensors

from rlsmoke.checkpoints import prune, synthesize, verify
from rlsmoke.checkpoints.shards import (
    TensorPlan,
    load_index,
    read_chunk,
    read_header,
    tensor_bytes,
    write_shards,
)
from rlsmoke.errors import CheckpointError
from rlsmoke.models import model_spec, reduce_layers
from rlsmoke.models.glm5 import glm5_744b_a40b, glm5_tiny
from rlsmoke.models.glm45 import glm45_355b_a32b, glm45_tiny


def copier(path, entry):
    return lambda i: read_chunk(path, entry, i)


EIGHT_LAYERS = {  # 3 dense + 5 MoE, the source upstream's 4-layer cut is made from
    "glm5-744b-a40b-4layer": lambda: glm5_tiny(reduce_layers(glm5_744b_a40b(), 3, 5)),
    "glm4.5-355b-a32b-4layer": lambda: glm45_tiny(reduce_layers(glm45_355b_a32b(), 3, 5)),
}


@pytest.mark.parametrize("case", list(EIGHT_LAYERS))
def test_prune_of_8_layers_equals_synthesized_4_layers(case, tmp_path):
    src = synthesize(EIGHT_LAYERS[case](), tmp_path / "8", max_shard_bytes=3_000_000)
    pruned = prune(src, tmp_path / "pruned", dense=3, moe=1)
    direct = synthesize(case, tmp_path / "4", tiny=True)
    a, b = raw_tensors(pruned), raw_tensors(direct)
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    diff = [k for k in a if a[k] != b[k]]  # dtype, shape and bytes
    assert not diff, diff
    assert json.loads((pruned / "config.json").read_text()) == json.loads(
        (direct / "config.json").read_text()
    )
    verify(pruned)


def with_mtp_layer(src, out):
    """A copy of `src` plus one MTP layer after the last (as GLM-5's layer 78): layer 3's tensors + eh_proj."""
    wm = load_index(src)
    n = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    plans = []
    for name, shard in wm.items():
        e = read_header(src / shard)[name]
        copy = copier(src / shard, e)
        plans.append(TensorPlan(name, e.dtype, e.shape, copy))
        if name.startswith(f"model.layers.{n - 1}."):
            plans.append(TensorPlan(name.replace(f"layers.{n - 1}.", f"layers.{n}."), e.dtype, e.shape, copy))
    h = model_spec("glm5-744b-a40b-4layer", tiny=True).hidden_size
    eh = torch.zeros(h, 2 * h, dtype=torch.bfloat16)
    plans.append(
        TensorPlan(f"model.layers.{n}.eh_proj.weight", "BF16", (h, 2 * h), lambda i: tensor_bytes(eh))
    )
    out.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (out / f).write_bytes((src / f).read_bytes())
    write_shards(out, plans)
    return out


def test_mtp_layers_are_dropped_or_kept_and_renumbered(tmp_path):
    src = synthesize("glm5-744b-a40b-4layer", tmp_path / "src", tiny=True)
    mtp = with_mtp_layer(src, tmp_path / "mtp")
    verify(mtp)  # an MTP layer beyond num_hidden_layers is legal
    dropped = prune(mtp, tmp_path / "dropped", dense=2, moe=1)
    kept = prune(mtp, tmp_path / "kept", dense=2, moe=1, keep_mtp=True)
    assert not any(k.startswith("model.layers.3.") for k in load_index(dropped))
    kept_names = load_index(kept)
    assert "model.layers.3.eh_proj.weight" in kept_names  # MTP 4 -> 3 after dropping dense layer 2
    assert "model.layers.2.mlp.experts.0.up_proj.weight" in kept_names  # MoE 3 -> 2
    cfg = json.loads((kept / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 3 and cfg["first_k_dense_replace"] == 2
    assert cfg["mlp_layer_types"] == ["dense", "dense", "sparse"]
    assert len(cfg["layer_types"]) == 3
    verify(kept)


def test_prune_refuses_more_layers_than_the_source_has(tmp_path):
    src = synthesize("glm4.5-355b-a32b-4layer", tmp_path / "src", tiny=True)
    with pytest.raises(CheckpointError, match=r"config.json: prune to 3 dense \+ 2 MoE"):
        prune(src, tmp_path / "out", dense=3, moe=2)
    assert not (tmp_path / "out").exists()
