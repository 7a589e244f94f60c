"""The topology's rules: a table of (id, predicate, message, fix) that one loop evaluates."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlsmoke.models import ModelSpec

Topology = Any  # rlsmoke.topology.Topology, which imports this table (so no import back)


@dataclass(frozen=True)
class Rule:
    id: str
    ok: Callable[[Topology, ModelSpec], bool]
    message: Callable[[Topology, ModelSpec], str]
    fix: str


def _divides(a: int, b: int) -> bool:
    return a > 0 and b % a == 0


def attention_tp(rollout) -> int:
    """SGLang's attention TP: the engine's GPUs, split among the dp ranks under dp-attention."""
    return max(1, rollout.tp // rollout.dp) if rollout.dp_attention else rollout.tp


def moe_tp(rollout) -> int:
    """SGLang's MoE TP: the engine's GPUs over its expert-parallel ranks."""
    return max(1, rollout.tp // rollout.ep) if rollout.ep > 0 else 0


def _heads(s: ModelSpec, kv: str = "KV heads") -> str:
    gqa = f", or neither divides nor is a multiple of the {kv} ({s.num_query_groups})"
    return f"the attention heads ({s.num_attention_heads})" + (gqa if s.attention == "gqa" else "")


def _heads_shard(tp: int, s: ModelSpec) -> bool:
    """The heads split over `tp`; under GQA the KV heads split too, or are replicated a whole number of times."""
    kv = s.num_query_groups
    return _divides(tp, s.num_attention_heads) and (s.attention != "gqa" or _divides(tp, kv) or tp % kv == 0)


RULES: tuple[Rule, ...] = (
    Rule(
        "nodes.whole",
        lambda t, s: t.gpus_per_node > 0 and t.num_gpus % t.gpus_per_node == 0,
        lambda t, s: f"num_gpus={t.num_gpus} is not a whole number of nodes of gpus_per_node={t.gpus_per_node}",
        "Adjust --num-gpus or --gpus-per-node.",
    ),
    Rule(
        "async.even_split",
        lambda t, s: t.mode != "async" or t.explicit_split or t.num_gpus % 2 == 0,
        lambda t, s: f"num_gpus={t.num_gpus} is odd: async mode cannot split it evenly between training and "
        f"rollout (actor_gpus={t.actor_gpus}, rollout_gpus={t.rollout_gpus})",
        "Use an even --num-gpus, set actor_gpus and rollout_gpus explicitly, or use --mode colocate.",
    ),
    Rule(
        "async.parts_positive",
        lambda t, s: t.mode != "async" or (t.actor_gpus >= 1 and t.rollout_gpus >= 1),
        lambda t, s: f"async mode needs GPUs on both sides: actor_gpus={t.actor_gpus}, rollout_gpus={t.rollout_gpus}",
        "Use --num-gpus >= 2, or --mode colocate.",
    ),
    Rule(
        "async.fits_nodes",
        lambda t, s: t.mode != "async" or t.actor_gpus + t.rollout_gpus <= t.num_gpus,
        lambda t, s: f"actor_gpus={t.actor_gpus} + rollout_gpus={t.rollout_gpus} exceed num_gpus={t.num_gpus}",
        "Adjust actor_gpus or rollout_gpus so that they fit the GPUs.",
    ),
    Rule(
        "colocate.same_gpus",
        lambda t, s: t.mode != "colocate" or t.actor_gpus == t.rollout_gpus == t.num_gpus,
        lambda t, s: f"colocate time-shares the same GPUs, but actor_gpus={t.actor_gpus}, "
        f"rollout_gpus={t.rollout_gpus}, num_gpus={t.num_gpus}",
        "Drop the actor_gpus/rollout_gpus overrides, or use --mode async.",
    ),
    Rule(
        "rollout.engine_multiple",
        lambda t, s: _divides(t.rollout.gpus_per_engine, t.rollout_gpus),
        lambda t, s: f"rollout_gpus={t.rollout_gpus} is not a multiple of "
        f"rollout.gpus_per_engine={t.rollout.gpus_per_engine}",
        "Adjust rollout.gpus_per_engine to divide the rollout GPUs.",
    ),
    Rule(
        "sglang.tp_is_engine_gpus",
        lambda t, s: t.rollout.tp == t.rollout.gpus_per_engine,
        lambda t, s: f"rollout.tp={t.rollout.tp} differs from rollout.gpus_per_engine={t.rollout.gpus_per_engine}; "
        "SGLang's tp_size is the GPUs of one engine",
        "Drop rollout.tp, or set rollout.gpus_per_engine instead.",
    ),
    Rule(
        "sglang.dp_needs_dp_attention",
        lambda t, s: t.rollout.dp <= 1 or t.rollout.dp_attention,
        lambda t, s: f"rollout.dp={t.rollout.dp} > 1 requires dp-attention, but rollout.dp_attention=false",
        "Set rollout.dp_attention=true, or rollout.dp=1.",
    ),
    Rule(
        "sglang.dp_divides_engine_gpus",
        lambda t, s: not t.rollout.dp_attention or _divides(t.rollout.dp, t.rollout.gpus_per_engine),
        lambda t, s: f"rollout.dp={t.rollout.dp} does not divide rollout.gpus_per_engine={t.rollout.gpus_per_engine}; "
        "under dp-attention each dp rank takes tp/dp GPUs (TPxDPxEP is not a GPU count)",
        "Adjust rollout.dp to a divisor of the GPUs per engine.",
    ),
    Rule(
        "sglang.ep_divides_engine_gpus",
        lambda t, s: _divides(t.rollout.ep, t.rollout.gpus_per_engine),
        lambda t, s: f"rollout.ep={t.rollout.ep} does not divide rollout.gpus_per_engine={t.rollout.gpus_per_engine}",
        "Adjust rollout.ep to a divisor of the GPUs per engine.",
    ),
    # SGLang checks these only when it builds the model, after its start-up (0.5.23:
    # layers/moe/fused_moe_triton/layer.py:414 and :427, models/deepseek_v2.py:2057, glm4_moe.py:237-246).
    Rule(
        "sglang.ep_divides_experts",
        lambda t, s: _divides(t.rollout.ep, s.num_experts),
        lambda t, s: f"rollout.ep={t.rollout.ep} does not divide the experts ({s.num_experts})",
        "Adjust rollout.gpus_per_engine (or rollout.ep) to a divisor of the number of experts.",
    ),
    Rule(
        "sglang.moe_tp_divides_moe_ffn",
        lambda t, s: _divides(moe_tp(t.rollout), s.moe_ffn_hidden_size),
        lambda t, s: f"SGLang's MoE TP (rollout.tp/ep = {moe_tp(t.rollout)}) does not divide the expert width "
        f"({s.moe_ffn_hidden_size})",
        "Adjust rollout.ep so that the GPUs per engine over it divide the expert width.",
    ),
    Rule(
        "sglang.attn_tp_divides_heads",
        lambda t, s: _heads_shard(attention_tp(t.rollout), s),
        lambda t, s: f"SGLang's attention TP ({attention_tp(t.rollout)}: rollout.tp"
        + (f"/dp = {t.rollout.tp}/{t.rollout.dp}" if t.rollout.dp_attention else "")
        + f") does not divide {_heads(s)}",
        "Adjust rollout.gpus_per_engine (or rollout.dp under dp-attention) so that the attention TP divides the heads.",
    ),
    Rule(
        "megatron.tp_divides_heads",
        # Under GQA, TP may also be a multiple of the query groups (megatron-core replicates KV heads).
        lambda t, s: _heads_shard(t.train.tp, s),
        lambda t, s: f"train.tp={t.train.tp} does not divide {_heads(s, 'query groups')}",
        "Adjust train.tp to a divisor of the heads (under GQA: one that divides or is a multiple of the query groups).",
    ),
    Rule(
        "megatron.ep_divides_experts",
        lambda t, s: _divides(t.train.ep, s.num_experts),
        lambda t, s: f"train.ep={t.train.ep} does not divide the experts ({s.num_experts})",
        "Adjust train.ep to a divisor of the number of experts.",
    ),
    Rule(
        "megatron.sp_needs_tp",
        lambda t, s: not t.train.sp or t.train.tp > 1,
        lambda t, s: f"train.sp=true needs train.tp > 1, but train.tp={t.train.tp}",
        "Set train.sp=false, or raise train.tp.",
    ),
    Rule(
        "megatron.pp_stages_nonempty",
        lambda t, s: t.train.pp >= 1 and len(t.train.pp_layers) == t.train.pp and min(t.train.pp_layers, default=0) >= 1,
        lambda t, s: f"train.pp={t.train.pp} over {s.num_layers} layers leaves a stage empty "
        f"(pp_layers={list(t.train.pp_layers)})",
        "Lower train.pp to at most the layer count, or give every stage a layer in train.pp_layers.",
    ),
    Rule(
        "megatron.pp_layers_sum",
        lambda t, s: sum(t.train.pp_layers) == s.num_layers,
        lambda t, s: f"train.pp_layers={list(t.train.pp_layers)} sums to {sum(t.train.pp_layers)}, "
        f"not the {s.num_layers} layers",
        "Make train.pp_layers add up to the layer count.",
    ),
    Rule(
        "megatron.world_tp_cp_pp",
        lambda t, s: _divides(t.train.tp * t.train.cp * t.train.pp, t.actor_gpus),
        lambda t, s: f"actor_gpus={t.actor_gpus} is not divisible by train.tp*cp*pp="
        f"{t.train.tp}*{t.train.cp}*{t.train.pp}={t.train.tp * t.train.cp * t.train.pp}",
        "Adjust train.tp, train.cp or train.pp so that their product divides the actor GPUs.",
    ),
    Rule(
        "megatron.world_etp_ep_pp",
        lambda t, s: _divides(t.train.etp * t.train.ep * t.train.pp, t.actor_gpus),
        lambda t, s: f"actor_gpus={t.actor_gpus} is not divisible by train.etp*ep*pp="
        f"{t.train.etp}*{t.train.ep}*{t.train.pp}={t.train.etp * t.train.ep * t.train.pp}",
        "Adjust train.ep, train.etp or train.pp so that their product divides the actor GPUs.",
    ),
    Rule(
        "train.positive",
        lambda t, s: min(t.train.tp, t.train.cp, t.train.ep, t.train.etp, t.rollout.gpus_per_engine, t.rollout.dp,
                         t.rollout.ep) >= 1,
        lambda t, s: f"parallel sizes must be >= 1: train={dataclasses.asdict(t.train)}, "
        f"rollout={dataclasses.asdict(t.rollout)}",
        "Set every size to a positive integer.",
    ),
)  # fmt: skip

# What decides whether SGLang can run an engine: its GPUs against the rollout's and the model's sizes.
ENGINE_RULES = tuple(r for r in RULES if r.id.startswith("sglang.") or r.id == "rollout.engine_multiple")


def violations(topo: Topology, spec: ModelSpec) -> list[tuple[str, str, str]]:
    return [(r.id, r.message(topo, spec), r.fix) for r in RULES if not r.ok(topo, spec)]
