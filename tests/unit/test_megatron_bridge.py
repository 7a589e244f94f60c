"""The HF <-> Megatron bridge on the three models' synthesized tiny 4-layer checkpoints.

Without megatron-core: HF -> Megatron -> rank shards -> Megatron -> HF is bit-exact at TP=1, TP=2,
EP=2 and TP=2 x EP=2, the fused layouts are the documented ones, and every fault twin round-trips
too (which is why only the log-prob gates can catch it).
With megatron-core (skipped with the reason otherwise): the bridge's names and shapes are what a real
`GPTModel` holds (strict load), its logits are HF's, and TP=2 / EP=2 run in two gloo processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from rlsmoke.bridge.convert import (
    DEFECTS,
    Parallel,
    hf_to_megatron,
    megatron_to_hf,
    padded_vocab,
    shard,
    unshard,
)
from rlsmoke.bridge.tables import rules
from rlsmoke.checkpoints import prepare
from rlsmoke.engine.megatron import available
from rlsmoke.errors import RlsmokeError
from rlsmoke.models import ModelSpec, model_spec

CASES = ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer"]
LAYOUTS = [Parallel(), Parallel(tp=2), Parallel(ep=2), Parallel(tp=2, ep=2, etp=1)]


def megatron_shapes(hf_shapes: Mapping[str, tuple[int, ...]], spec: ModelSpec, par: Parallel,
                    rank: int = 0, *, vocab_size: int | None = None) -> dict[str, tuple[int, ...]]:  # fmt: skip
    """HF name -> shape in, one rank's Megatron name -> shape out, without any data (meta tensors)."""
    hf = {n: torch.empty(s, device="meta") for n, s in hf_shapes.items()}
    full = hf_to_megatron(hf, spec, vocab_size=vocab_size)
    return {n: tuple(t.shape) for n, t in shard(full, spec, hf, par, rank).items()}


@pytest.fixture(scope="module")
def checkpoints():
    from rlsmoke.engine.read import read_checkpoint

    return {c: read_checkpoint(prepare(c, tiny=True), "cpu") for c in CASES}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("par", LAYOUTS, ids=lambda p: f"tp{p.tp}-ep{p.ep}-etp{p.expert_tp}")
def test_round_trip_is_bit_exact(checkpoints, case, par):
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    full = hf_to_megatron(hf, spec)
    states = [shard(full, spec, hf, par, r) for r in range(par.world_size)]
    back = megatron_to_hf(unshard(states, spec, hf, par), spec, hf)

    assert sorted(back) == sorted(hf)
    for name, t in hf.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name
    # the shards really are cut: TP halves the column-parallel rows, EP halves the local experts
    local = [k for k in states[0] if ".local_experts." in k and k.endswith("linear_fc2.weight")]
    assert len(local) == spec.num_experts // par.ep
    if par.tp == 2:
        name = "embedding.word_embeddings.weight"
        assert states[0][name].shape[0] * 2 == full[name].shape[0]
        assert not torch.equal(states[0][name], states[1][name])


def test_gqa_qkv_is_interleaved_per_query_group_and_tp_takes_whole_groups(checkpoints):
    case = "glm4.5-355b-a32b-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    a = "model.layers.0.self_attn."
    groups, per_group, d = spec.num_query_groups, spec.num_attention_heads // spec.num_query_groups, 32
    qkv = hf_to_megatron(hf, spec)["decoder.layers.0.self_attention.linear_qkv.weight"]
    for g in range(groups):
        block = qkv[g * (per_group + 2) * d : (g + 1) * (per_group + 2) * d]
        assert torch.equal(
            block[: per_group * d], hf[a + "q_proj.weight"][g * per_group * d : (g + 1) * per_group * d]
        )
        assert torch.equal(
            block[per_group * d : (per_group + 1) * d], hf[a + "k_proj.weight"][g * d : (g + 1) * d]
        )
        assert torch.equal(block[(per_group + 1) * d :], hf[a + "v_proj.weight"][g * d : (g + 1) * d])
    rank1 = shard(hf_to_megatron(hf, spec), spec, hf, Parallel(tp=2), 1)
    assert torch.equal(rank1["decoder.layers.0.self_attention.linear_qkv.weight"], qkv[qkv.shape[0] // 2 :])


def test_fused_gate_up_holds_gate_then_up_on_each_tp_rank(checkpoints):
    case = "glm5-744b-a40b-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    gate, up = (hf[f"model.layers.3.mlp.experts.5.{p}_proj.weight"] for p in ("gate", "up"))
    par = Parallel(tp=2, ep=2)  # expert 5 of 16 lives on EP rank 0 as local expert 5
    for rank in range(par.world_size):
        tp_rank, ep_rank, etp_rank = par.coords(rank)
        if ep_rank:
            continue
        fc1 = shard(hf_to_megatron(hf, spec), spec, hf, par, rank)[
            "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight"
        ]
        half = gate.shape[0] // 2
        assert torch.equal(
            fc1,
            torch.cat(
                [gate[etp_rank * half : (etp_rank + 1) * half], up[etp_rank * half : (etp_rank + 1) * half]]
            ),
        )


def test_expert_parallel_gives_each_rank_a_contiguous_block_by_local_index(checkpoints):
    case = "glm4.5-355b-a32b-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    par = Parallel(ep=2)
    rank1 = shard(hf_to_megatron(hf, spec), spec, hf, par, 1)
    local = spec.num_experts // 2
    assert torch.equal(rank1["decoder.layers.3.mlp.experts.local_experts.0.linear_fc2.weight"],
                       hf[f"model.layers.3.mlp.experts.{local}.down_proj.weight"])  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_shapes_without_data_match_the_converted_tensors(checkpoints, case):
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    par = Parallel(tp=2, ep=2, etp=1)
    shapes = megatron_shapes({n: tuple(t.shape) for n, t in hf.items()}, spec, par, rank=3)
    real = shard(hf_to_megatron(hf, spec), spec, hf, par, 3)
    assert shapes == {n: tuple(t.shape) for n, t in real.items()}


def test_vocab_padding_is_added_for_megatron_and_stripped_for_hf(checkpoints):
    case = "glm4.5-355b-a32b-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    padded = padded_vocab(spec.vocab_size + 1, 128, 2)
    assert padded % 256 == 0 and padded > spec.vocab_size
    full = hf_to_megatron(hf, spec, vocab_size=spec.vocab_size + 60)
    assert full["output_layer.weight"].shape[0] == spec.vocab_size + 60
    assert not full["output_layer.weight"][spec.vocab_size :].any()
    assert torch.equal(megatron_to_hf(full, spec, hf)["lm_head.weight"], hf["lm_head.weight"])


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_bridge_defect_round_trips_yet_changes_what_megatron_holds(checkpoints, defect):
    case = "glm5-744b-a40b-4layer" if defect != "bridge-kv-order" else "glm4.5-355b-a32b-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    clean, wrong = hf_to_megatron(hf, spec), hf_to_megatron(hf, spec, defect=defect)
    changed = [n for n in clean if not torch.equal(clean[n], wrong[n])]
    assert changed, f"{defect} changed nothing"
    back = megatron_to_hf(wrong, spec, hf, defect=defect)
    assert all(torch.equal(back[n], hf[n]) for n in hf)


def test_mla_kv_order_defect_permutes_kv_up_rows(checkpoints):
    case = "glm5-744b-a40b-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    name = "decoder.layers.0.self_attention.linear_kv_up_proj.weight"
    clean, wrong = hf_to_megatron(hf, spec)[name], hf_to_megatron(hf, spec, defect="bridge-kv-order")[name]
    assert not torch.equal(clean, wrong)
    assert torch.equal(clean.sort(dim=0).values, wrong.sort(dim=0).values)  # same rows, other order


def test_an_hf_tensor_without_a_rule_is_an_error_not_dropped(checkpoints):
    case = "glm4.5-355b-a32b-4layer"
    hf, spec = dict(checkpoints[case]), model_spec(case, tiny=True)
    hf["model.layers.0.self_attn.surprise.weight"] = torch.zeros(2)
    with pytest.raises(RlsmokeError) as err:
        hf_to_megatron(hf, spec)
    assert err.value.rule == "bridge.hf_names" and "surprise" in str(err.value)


def test_a_missing_hf_tensor_is_an_error(checkpoints):
    case = "glm5-744b-a40b-4layer"
    hf, spec = dict(checkpoints[case]), model_spec(case, tiny=True)
    del hf["model.layers.3.mlp.experts.7.up_proj.weight"]
    with pytest.raises(RlsmokeError, match="experts.7.up_proj"):
        hf_to_megatron(hf, spec)


def test_layout_the_model_does_not_divide_is_refused():
    spec = model_spec("glm4.5-355b-a32b-4layer", tiny=True)
    with pytest.raises(RlsmokeError, match="ep=3"):
        Parallel(ep=3).check(spec)


def test_flash_kda_layers_and_vision_tower_are_covered(checkpoints):
    case = "glm5.3-flash-4layer"
    hf, spec = checkpoints[case], model_spec(case, tiny=True)
    names = {r.megatron for r in rules(spec, hf)}
    assert "decoder.layers.0.self_attention.A_log" in names  # KDA layer
    assert "decoder.layers.3.self_attention.linear_kv_up_proj.weight" in names  # MLA/DSA layer
    assert any(n.startswith("model.visual.") for n in names)


# ---- against the real megatron-core ---------------------------------------------------------------

needs_mcore = pytest.mark.skipif(
    not available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"
)
MCORE_CASES = ["glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer"]  # megatron-core has no KDA (Flash)
TOKENS = torch.randint(0, 4000, (2, 24), generator=torch.Generator().manual_seed(0))


def _rank_forward(rank, par, case):
    """One rank: build the real GPTModel, strict-load the bridge's shard, forward, read the state back."""
    from rlsmoke.engine.megatron.model import build_gpt, device_shim, rank_state
    from rlsmoke.engine.read import read_checkpoint

    spec = model_spec(case, tiny=True)
    hf = {k: v.float() for k, v in read_checkpoint(prepare(case, tiny=True), "cpu").items()}
    model = build_gpt(spec, par)
    model.load_state_dict(shard(hf_to_megatron(hf, spec), spec, hf, par, rank), strict=True)
    model.eval()
    pos = torch.arange(TOKENS.shape[1])[None].expand(TOKENS.shape[0], -1)
    with torch.no_grad(), device_shim("cpu"):
        logits = model(TOKENS, pos, None)
        if par.tp > 1:  # the output layer is vocab-parallel: each TP rank holds its slice of the logits
            from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

            logits = gather_from_tensor_model_parallel_region(logits)
    return logits, rank_state(model)


@needs_mcore
@pytest.mark.parametrize("case", MCORE_CASES)
def test_real_gptmodel_holds_the_bridge_names_and_its_logits_are_hf(case):
    from megatron_ranks import run_ranks

    from rlsmoke.engine.model import load_policy
    from rlsmoke.engine.read import read_checkpoint

    [(logits, state)] = run_ranks(_rank_forward, Parallel(), case)
    spec = model_spec(case, tiny=True)
    path = Path(prepare(case, tiny=True))
    hf = {k: v.float() for k, v in read_checkpoint(path, "cpu").items()}
    assert sorted(state) == sorted(hf_to_megatron(hf, spec))
    with torch.no_grad():
        ref = load_policy(path, spec, "float32", "cpu")(input_ids=TOKENS).logits
    # GLM-5 was 2.6e-3 off before its latent norms got HF's eps (build_gpt sets it)
    assert (logits - ref).abs().max().item() < 1e-4


@needs_mcore
@pytest.mark.parametrize("case", MCORE_CASES)
@pytest.mark.parametrize("par", [Parallel(tp=2), Parallel(ep=2)], ids=["tp2", "ep2"])
def test_real_gptmodel_in_two_gloo_ranks_matches_one_rank(case, par):
    from megatron_ranks import run_ranks

    from rlsmoke.engine.read import read_checkpoint

    [(single, _)] = run_ranks(_rank_forward, Parallel(), case)
    ranks = run_ranks(_rank_forward, par, case)
    spec = model_spec(case, tiny=True)
    hf = read_checkpoint(prepare(case, tiny=True), "cpu")
    for logits, _ in ranks:
        assert (logits - single).abs().max().item() < 1e-4
    back = megatron_to_hf(unshard([s for _, s in ranks], spec, hf, par), spec, hf)
    assert all(torch.equal(back[n], hf[n].float()) for n in hf)


def _forward_past_index_topk(rank, par, case):
    """A forward one token past the DSA index top-k: the rule, or None if it ran."""
    from rlsmoke.engine.megatron.model import build_gpt, device_shim
    from rlsmoke.engine.read import read_checkpoint

    spec = model_spec(case, tiny=True)
    hf = {k: v.float() for k, v in read_checkpoint(prepare(case, tiny=True), "cpu").items()}
    model = build_gpt(spec, par)
    model.load_state_dict(shard(hf_to_megatron(hf, spec), spec, hf, par, rank), strict=True)
    n = dict(spec.hf_extra)["index_topk"] + 1
    tokens = torch.zeros(1, n, dtype=torch.long)
    try:
        with torch.no_grad(), device_shim("cpu"):
            model(tokens, torch.arange(n)[None], None)
    except RlsmokeError as exc:
        return exc.rule, str(exc)
    return None, ""


@needs_mcore
def test_dense_attention_refuses_a_sequence_past_the_dsa_index_topk():
    """Dense causal attention equals DSA only within index_topk keys: past it the stand-in would
    silently compute something else, so it refuses."""
    from megatron_ranks import run_ranks

    [(rule, message)] = run_ranks(_forward_past_index_topk, Parallel(), "glm5-744b-a40b-4layer")
    assert rule == "megatron.dsa_topk" and "exceeds the DSA index top-k" in message


def test_an_unknown_bridge_defect_is_refused(checkpoints):
    case = "glm4.5-355b-a32b-4layer"
    with pytest.raises(RlsmokeError) as err:
        hf_to_megatron(checkpoints[case], model_spec(case, tiny=True), defect="bridge-nonsense")
    assert err.value.rule == "bridge.defect" and "bridge-kv-order" in err.value.fix


def test_unshard_refuses_a_rank_count_that_is_not_the_world(checkpoints):
    case = "glm4.5-355b-a32b-4layer"
    hf, spec, par = checkpoints[case], model_spec("glm4.5-355b-a32b-4layer", tiny=True), Parallel(tp=2)
    states = [shard(hf_to_megatron(hf, spec), spec, hf, par, r) for r in range(2)]
    with pytest.raises(RlsmokeError, match="1 rank states for a world of 2") as err:
        unshard(states[:1], spec, hf, par)
    assert err.value.rule == "bridge.layout"


def test_a_tensor_tp_does_not_divide_is_refused_not_cut_unevenly():
    from rlsmoke.bridge.convert import _cut
    from rlsmoke.bridge.tables import Rule

    rule = Rule("decoder.layers.0.odd.weight", ("odd",), tp="column")
    assert _cut(rule, torch.zeros(6, 4), 2, 1).shape == (3, 4)
    with pytest.raises(RlsmokeError, match="5 rows, not a multiple of TP=2") as err:
        _cut(rule, torch.zeros(5, 4), 2, 0)
    assert err.value.rule == "bridge.layout"


# ---- the run's options -----------------------------------------------------------------------------


def test_a_bridge_defect_needs_the_megatron_trainer():
    from rlsmoke.engine.config import RunConfig, parse_inject

    with pytest.raises(RlsmokeError, match="needs --trainer megatron"):
        RunConfig(case="glm5-744b-a40b-4layer", tiny=True, inject=parse_inject("bridge-kv-order")).validate()
    RunConfig(case="glm5-744b-a40b-4layer", tiny=True, trainer="megatron",
              inject=parse_inject("bridge-kv-order")).validate()  # fmt: skip


def test_the_megatron_trainer_refuses_async_and_several_gpus():
    from rlsmoke.engine.config import RunConfig

    for layout in ({"mode": "async"}, {"num_gpus": 2}):
        with pytest.raises(RlsmokeError, match="world size 1"):
            RunConfig(case="glm5-744b-a40b-4layer", tiny=True, trainer="megatron", **layout).validate()
    with pytest.raises(RlsmokeError, match="no KDA linear attention"):
        RunConfig(case="glm5.3-flash-4layer", tiny=True, trainer="megatron").validate()
    # refused before anything loads: what the megatron trainer does not wire
    from rlsmoke.engine.config import parse_inject

    with pytest.raises(RlsmokeError, match="runs without train-dropout, gradient checkpointing"):
        RunConfig(case="glm5-744b-a40b-4layer", tiny=True, trainer="megatron", gradient_checkpointing=True,
                  inject=parse_inject("train-dropout=0.1")).validate()  # fmt: skip


def test_the_megatron_trainer_refuses_flash_with_a_rule():
    from rlsmoke.engine.megatron.model import build_gpt

    with pytest.raises(RlsmokeError) as err:
        build_gpt(model_spec("glm5.3-flash-4layer", tiny=True), Parallel())
    assert err.value.rule == "megatron.model"
