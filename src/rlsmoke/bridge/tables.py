"""HF <-> Megatron names, as data: one `Rule` per Megatron tensor (megatron-core's local layer spec), the
HF tensors it is made of, and how TP cuts it (`replicated`, `column`, `row`, `vocab`, `gate_up`, `qkv`).
Expert rules carry `{e}`, split over EP ranks in contiguous blocks. GLM-5.3-Flash's KDA and hyper-connection
tensors keep their HF names under the Megatron layer (no megatron-core model holds them). No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from rlsmoke.models import ModelSpec

Cut = Literal["replicated", "column", "row", "vocab", "gate_up", "qkv"]  # how TP cuts a tensor (above)


@dataclass(frozen=True)
class Rule:
    megatron: str
    hf: tuple[str, ...]
    tp: Cut = "replicated"
    expert: bool = False


def _mlp(hf: str, mg: str, moe: bool) -> list[Rule]:
    if not moe:
        return [
            Rule(mg + "linear_fc1.weight", (hf + "gate_proj.weight", hf + "up_proj.weight"), "gate_up"),
            Rule(mg + "linear_fc2.weight", (hf + "down_proj.weight",), "row"),
        ]
    ex, expert, shared = mg + "experts.local_experts.{e}.", hf + "experts.{e}.", hf + "shared_experts."
    expert_fc1 = (expert + "gate_proj.weight", expert + "up_proj.weight")
    shared_fc1 = (shared + "gate_proj.weight", shared + "up_proj.weight")
    return [
        Rule(mg + "router.weight", (hf + "gate.weight",)),
        Rule(mg + "router.expert_bias", (hf + "gate.e_score_correction_bias",)),
        Rule(ex + "linear_fc1.weight", expert_fc1, "gate_up", expert=True),
        Rule(ex + "linear_fc2.weight", (expert + "down_proj.weight",), "row", expert=True),
        Rule(mg + "shared_experts.linear_fc1.weight", shared_fc1, "gate_up"),
        Rule(mg + "shared_experts.linear_fc2.weight", (shared + "down_proj.weight",), "row"),
    ]


def _gqa(spec: ModelSpec, hf: str, mg: str) -> list[Rule]:
    rules = [
        Rule(mg + "linear_qkv.weight", tuple(hf + f"{p}_proj.weight" for p in "qkv"), "qkv"),
        Rule(mg + "linear_proj.weight", (hf + "o_proj.weight",), "row"),
    ]
    if spec.hf_extra.get("attention_bias"):
        rules.append(Rule(mg + "linear_qkv.bias", tuple(hf + f"{p}_proj.bias" for p in "qkv"), "qkv"))
    if spec.hf_extra.get("use_qk_norm"):
        rules += [Rule(mg + "q_layernorm.weight", (hf + "q_norm.weight",)),
                  Rule(mg + "k_layernorm.weight", (hf + "k_norm.weight",))]  # fmt: skip
    return rules


# MLA: megatron-core name -> (HF name, TP cut); down projections duplicated as TE's spec builds them.
MLA: dict[str, tuple[str, Cut]] = {
    "linear_q_down_proj.weight": ("q_a_proj.weight", "replicated"),
    "q_layernorm.weight": ("q_a_layernorm.weight", "replicated"),
    "linear_q_up_proj.weight": ("q_b_proj.weight", "column"),
    "linear_kv_down_proj.weight": ("kv_a_proj_with_mqa.weight", "replicated"),
    "kv_layernorm.weight": ("kv_a_layernorm.weight", "replicated"),
    "linear_kv_up_proj.weight": ("kv_b_proj.weight", "column"),
    "linear_proj.weight": ("o_proj.weight", "row"),
}
# DSA indexer: megatron-core names -> HF names, duplicated on every TP rank (the key pool: GLM-5.3-Flash's).
DSA_INDEXER = {
    "linear_wq_b.weight": "wq_b.weight",
    "linear_wk.weight": "wk.weight",
    "k_norm.weight": "k_norm.weight",
    "k_norm.bias": "k_norm.bias",
    "linear_weights_proj.weight": "weights_proj.weight",
    "index_kpool_compress_ape": "index_kpool_compress_ape",
    "index_kpool_compress_gate": "index_kpool_compress_gate",
}
# KDA (no megatron-core module): HF name -> TP cut, by heads.
KDA: dict[str, Cut] = {
    "q_proj.weight": "column", "k_proj.weight": "column", "v_proj.weight": "column",
    "q_conv1d.weight": "column", "k_conv1d.weight": "column", "v_conv1d.weight": "column",
    "f_a_proj.weight": "replicated", "f_b_proj.weight": "column",
    "g_a_proj.weight": "replicated", "g_b_proj.weight": "column",
    "b_proj.weight": "column", "A_log": "column", "dt_bias": "column",
    "o_norm.weight": "replicated", "o_proj.weight": "row",
}  # fmt: skip
HYPER_CONNECTIONS = tuple(f"hc_{part}_{name}" for part in ("attn", "ffn") for name in ("base", "fn", "scale"))


def rules(spec: ModelSpec, hf_names: Iterable[str]) -> list[Rule]:
    """Every Megatron tensor of `spec`, given the HF names (a layer with `self_attn.A_log` is KDA)."""
    hf_names = set(hf_names)
    p = "model.language_model." if spec.family == "glm5.3-flash" else "model."  # Flash: a multimodal wrapper
    out = [
        Rule("embedding.word_embeddings.weight", (p + "embed_tokens.weight",), "vocab"),
        Rule("decoder.final_layernorm.weight", (p + "norm.weight",)),
        Rule("output_layer.weight", ("lm_head.weight",), "vocab"),
    ]
    for i in range(spec.num_layers):
        hf, mg = f"{p}layers.{i}.", f"decoder.layers.{i}."
        out += [Rule(mg + "input_layernorm.weight", (hf + "input_layernorm.weight",)),
                Rule(mg + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",))]  # fmt: skip
        attn, mg_attn = hf + "self_attn.", mg + "self_attention."
        if spec.attention == "gqa":
            out += _gqa(spec, attn, mg_attn)
        elif attn + "A_log" in hf_names:
            out += [Rule(mg_attn + name, (attn + name,), cut) for name, cut in KDA.items()]
        else:  # MLA, and the DSA indexer's tensors the checkpoint holds
            out += [Rule(mg_attn + m, (attn + h,), cut) for m, (h, cut) in MLA.items()]
            hf_ix, mg_ix = attn + "indexer.", mg_attn + "core_attention.indexer."
            out += [Rule(mg_ix + m, (hf_ix + h,)) for m, h in DSA_INDEXER.items() if hf_ix + h in hf_names]
        out += [Rule(mg + h, (hf + h,)) for h in HYPER_CONNECTIONS if hf + h in hf_names]
        out += _mlp(hf + "mlp.", mg + "mlp.", moe=i >= spec.first_k_dense)
    # a vision tower travels under its own name; anything else unruled in the text tower is an error
    out += [Rule(n, (n,)) for n in sorted(hf_names) if not n.startswith(p) and n != "lm_head.weight"]
    return out


def expert_name(template: str, e: int | None) -> str:
    """Expert `e`'s name (a name without `{e}`, of no expert, as it is)."""
    return template.replace("{e}", str(e))
