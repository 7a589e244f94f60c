"""The bridge: HF state <-> whole Megatron state (`hf_to_megatron`, `megatron_to_hf`) <-> per-rank shards
(`shard`, `unshard`), each step checkable alone. Tensors are moved, never computed, so a round trip is
bit-exact. A `defect` (the fault twins) is a symmetric mistake: it round-trips too, yet the Megatron model
computes with the wrong layout, which only the log-prob gates can see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rlsmoke.bridge.tables import Rule, expert_name, rules
from rlsmoke.errors import RlsmokeError, require_known
from rlsmoke.models import ModelSpec

# name -> what it gets wrong (both directions, so a round trip cannot see it)
DEFECTS = {
    "bridge-kv-order": "MLA's kv_b_proj rows taken as [v; k_nope] per head (GQA: k and v swapped per group)",
    "bridge-expert-swap": "routed experts 0 and 1 swapped in every MoE layer",
    "bridge-gate-up-order": "fused SwiGLU fc1 taken as [up; gate] instead of [gate; up]",
}


@dataclass(frozen=True)
class Parallel:
    """A training layout: world = tp x dp ranks, experts over ep x etp; megatron-core's rank order."""

    tp: int = 1
    ep: int = 1
    etp: int | None = None  # None: megatron-core's default, the TP size
    sp: bool = False  # sequence parallelism over the TP ranks (Megatron's --sequence-parallel; TP > 1 only)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def world_size(self) -> int:
        """The smallest world that holds both grids."""
        return math.lcm(self.tp, self.ep * self.expert_tp)

    def executed(self) -> dict[str, int | bool]:
        """The layout as run: what summary.json records under `parallel`."""
        dp = self.world_size // self.tp  # replicas of the dense layers (PP = CP = 1 here)
        return {"tp": self.tp, "ep": self.ep, "pp": 1, "cp": 1, "dp": dp, "sp": self.tp > 1 and self.sp}

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, ep_rank, etp_rank) of a global rank."""
        return rank % self.tp, (rank // self.expert_tp) % self.ep, rank % self.expert_tp

    def check(self, spec: ModelSpec) -> None:
        problems = []
        if spec.num_experts % self.ep:
            problems.append(f"ep={self.ep} does not divide num_experts={spec.num_experts}")
        if spec.tp_divisor % self.tp:
            problems.append(f"tp={self.tp} does not divide {spec.tp_divisor} heads/query groups")
        if problems:
            raise RlsmokeError(
                "; ".join(problems), rule="bridge.layout", fix="choose a TP/EP the model divides"
            )


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM's padded vocab: a multiple of divisible_by x TP."""
    m = divisible_by * tp
    return -(-vocab // m) * m


# ---- HF <-> whole Megatron state -------------------------------------------------------------------


def _fuse(rule: Rule, parts: list[torch.Tensor], spec: ModelSpec, defect: str | None) -> torch.Tensor:
    if rule.tp == "qkv":
        q, k, v = (p.reshape(spec.num_query_groups, -1, *p.shape[1:]) for p in parts)
        if defect == "bridge-kv-order":
            k, v = v, k
        return torch.cat([q, k, v], dim=1).reshape(-1, *parts[0].shape[1:])
    if rule.tp == "gate_up" and defect == "bridge-gate-up-order":
        parts = parts[::-1]
    return torch.cat(parts, dim=0) if len(parts) > 1 else parts[0]


def _split(rule: Rule, t: torch.Tensor, spec: ModelSpec, defect: str | None) -> list[torch.Tensor]:
    if len(rule.hf) == 1:
        return [t]
    if rule.tp == "qkv":
        groups = spec.num_query_groups
        per_group = spec.num_attention_heads // groups
        g = t.reshape(groups, -1, *t.shape[1:])
        d = g.shape[1] // (per_group + 2)
        q, k, v = g.split([per_group * d, d, d], dim=1)
        if defect == "bridge-kv-order":
            k, v = v, k
        return [x.reshape(-1, *t.shape[1:]) for x in (q, k, v)]
    parts = list(t.chunk(2, dim=0))
    return parts[::-1] if rule.tp == "gate_up" and defect == "bridge-gate-up-order" else parts


# The DSA indexer tensors whose rows are head dims (wq_b: per indexer head).
INDEXER_HEAD_DIM_ROWS = tuple(f"core_attention.indexer.{n}" for n in
                              ("linear_wq_b.weight", "linear_wk.weight", "k_norm.weight", "k_norm.bias"))  # fmt: skip


def moves_indexer_rope(spec: ModelSpec) -> bool:
    """GLM-5's HF indexer ropes the first dims of each head, megatron-core's `DSAIndexer` the last."""
    return spec.family == "glm5"


def _head_rows(
    rule: Rule, t: torch.Tensor, spec: ModelSpec, defect: str | None, *, to_megatron: bool
) -> torch.Tensor:
    """Rows moved within each head: the indexer's RoPE rows between first and last (as Miles' converter
    does), or bridge-kv-order's MLA [k_nope; v] read as [v; k_nope]."""
    x = spec.hf_extra
    if rule.megatron.endswith(INDEXER_HEAD_DIM_ROWS) and moves_indexer_rope(spec):
        rows, first = x["index_head_dim"], x["qk_rope_head_dim"]
    elif defect == "bridge-kv-order" and rule.megatron.endswith("linear_kv_up_proj.weight"):
        rows, first = x["qk_nope_head_dim"] + x["v_head_dim"], x["qk_nope_head_dim"]
    else:
        return t
    cut = first if to_megatron else rows - first  # the rows of each head that move to its end
    return t.reshape(-1, rows, *t.shape[1:]).roll(-cut, dims=1).reshape(t.shape)


def _expert_source(e: int | None, spec: ModelSpec, defect: str | None) -> int | None:
    return 1 - e if defect == "bridge-expert-swap" and e in (0, 1) and spec.num_experts > 1 else e


def _check_defect(defect: str | None) -> None:
    if defect is not None:
        require_known("defect", defect, DEFECTS, rule="bridge.defect")


def hf_to_megatron(hf: Mapping[str, torch.Tensor], spec: ModelSpec, *, vocab_size: int | None = None,
                   defect: str | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The whole Megatron state (experts by global index). `vocab_size`: pad the vocab rows to it."""
    _check_defect(defect)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for rule in rules(spec, hf):
        for e in range(spec.num_experts) if rule.expert else (None,):
            names = [expert_name(n, _expert_source(e, spec, defect)) for n in rule.hf]
            if missing := [n for n in names if n not in hf]:
                raise RlsmokeError(f"HF tensor {missing[0]} is missing for {rule.megatron}",
                                   rule="bridge.hf_names", fix="convert a checkpoint of this model")  # fmt: skip
            used.update(names)
            t = _fuse(rule, [hf[n] for n in names], spec, defect)
            t = _head_rows(rule, t, spec, defect, to_megatron=True)
            if rule.tp == "vocab" and vocab_size and vocab_size > t.shape[0]:
                t = torch.cat([t, t.new_zeros(vocab_size - t.shape[0], *t.shape[1:])])
            out[expert_name(rule.megatron, e)] = t
    if left := sorted(set(hf) - used):
        raise RlsmokeError(f"HF tensor {left[0]} (+{len(left) - 1} more) has no Megatron rule",
                           rule="bridge.hf_names", fix="add a rule to rlsmoke.bridge.tables")  # fmt: skip
    return out


def megatron_to_hf(full: Mapping[str, torch.Tensor], spec: ModelSpec, hf_names,
                   *, defect: str | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """HF tensors from the whole Megatron state: the weight sync into the rollout engine."""
    _check_defect(defect)
    out: dict[str, torch.Tensor] = {}
    for rule in rules(spec, hf_names):
        for e in range(spec.num_experts) if rule.expert else (None,):
            t = full[expert_name(rule.megatron, e)]
            if rule.tp == "vocab":
                t = t[: spec.vocab_size]
            t = _head_rows(rule, t, spec, defect, to_megatron=False)
            src = _expert_source(e, spec, defect)
            for name, part in zip(rule.hf, _split(rule, t, spec, defect), strict=True):
                out[expert_name(name, src)] = part
    return out


# ---- whole Megatron state <-> per-rank shards -------------------------------------------------------


def _cut(rule: Rule, t: torch.Tensor, n: int, i: int) -> torch.Tensor:
    if n == 1 or rule.tp == "replicated":
        return t
    if rule.tp == "row":
        return t.chunk(n, dim=1)[i]
    if rule.tp == "gate_up":
        gate, up = t.chunk(2, dim=0)
        return torch.cat([gate.chunk(n, dim=0)[i], up.chunk(n, dim=0)[i]])
    if t.shape[0] % n:
        raise RlsmokeError(f"{rule.megatron} has {t.shape[0]} rows, not a multiple of TP={n}",
                           rule="bridge.layout", fix="choose a TP the model divides")  # fmt: skip
    return t.chunk(n, dim=0)[i]  # column, vocab, qkv (query groups are contiguous rows)


def _join(rule: Rule, parts: list[torch.Tensor]) -> torch.Tensor:
    if len(parts) == 1 or rule.tp == "replicated":
        return parts[0]
    if rule.tp == "row":
        return torch.cat(parts, dim=1)
    if rule.tp == "gate_up":
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(parts, dim=0)


def shard(full: Mapping[str, torch.Tensor], spec: ModelSpec, hf_names, par: Parallel,
          rank: int) -> dict[str, torch.Tensor]:  # fmt: skip
    """One rank's Megatron state: TP cuts of the dense tensors, its EP block of experts (local index)."""
    par.check(spec)
    tp_rank, ep_rank, etp_rank = par.coords(rank)
    local = spec.num_experts // par.ep
    out = {}
    for rule in rules(spec, hf_names):
        if rule.expert:
            for j in range(local):
                t = full[expert_name(rule.megatron, ep_rank * local + j)]
                out[expert_name(rule.megatron, j)] = _cut(rule, t, par.expert_tp, etp_rank).clone()
        else:
            out[rule.megatron] = _cut(rule, full[rule.megatron], par.tp, tp_rank).clone()
    return out


def unshard(states: Sequence[Mapping[str, torch.Tensor]], spec: ModelSpec, hf_names,
            par: Parallel) -> dict[str, torch.Tensor]:  # fmt: skip
    """The whole Megatron state from every rank's state (`states[r]` is rank r's)."""
    par.check(spec)
    if len(states) != par.world_size:
        raise RlsmokeError(f"{len(states)} rank states for a world of {par.world_size}", rule="bridge.layout")
    by_tp = {par.coords(r)[0]: states[r] for r in reversed(range(len(states)))}  # first rank of each tp_rank
    by_expert = {par.coords(r)[1:]: states[r] for r in reversed(range(len(states)))}
    local = spec.num_experts // par.ep
    out = {}
    for rule in rules(spec, hf_names):
        if rule.expert:
            for ep_rank in range(par.ep):
                for j in range(local):
                    parts = [by_expert[ep_rank, i][expert_name(rule.megatron, j)]
                             for i in range(par.expert_tp)]  # fmt: skip
                    out[expert_name(rule.megatron, ep_rank * local + j)] = _join(rule, parts)
        else:
            out[rule.megatron] = _join(rule, [by_tp[i][rule.megatron] for i in range(par.tp)])
    return out
