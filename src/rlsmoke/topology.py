"""Topology: one pure function from (model, platform, NUM_GPUS, mode, overrides) to a validated plan.

Every count in a launch comes from here. Values are *derived unless set*: `--set train.tp=2` fixes
TP and everything that depends on it (SP, DP) is derived again. Validation is a table of rules
(id, predicate, message, fix) evaluated by one loop; all failures are reported together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rlsmoke.errors import RlsmokeError, TopologyError, UnknownNameError
from rlsmoke.facts import DEFAULT_GPUS_PER_NODE, MODES
from rlsmoke.models import ModelSpec
from rlsmoke.platforms import get_platform

# Upper bounds on the sizes a user gives: no plan loop may run in time linear in an unbounded number.
# Far past the seeds (64 GPUs) and any one Miles job; a node of more than 64 GPUs does not exist.
MAX_NUM_GPUS = 65536
MAX_GPUS_PER_NODE = 64


@dataclass(frozen=True)
class Target:
    """The Miles / SGLang versions whose flags a plan renders."""

    name: str
    miles: str
    sglang: str
    dsa_flag: str  # SGLang's sparse-attention flag stem: "nsa" (Miles 0.0.2's SGLang) or "dsa" (0.5.23)
    checkpoint_dialect: str  # config.json dialect the target's Miles accepts for GLM-5
    cuda_graph_bs_flag: str = "cuda-graph-max-bs"  # SGLang 0.5.23 split it into -decode / -prefill
    # Whose launcher the flags follow: "seed-004" (the seeds' scripts, Miles of May 2026) or "main-2026-08"
    # (Miles main's GLM-5 launcher and its 2-GPU CI test). Rows of launch.substitutions name the launchers they hold for.
    launcher: str = "seed-004"
    megatron: str = "bundled"  # the Megatron-LM the target's Miles runs with: a commit of its `miles-main` branch

    @property
    def main(self) -> bool:
        return self.launcher == "main-2026-08"


TARGETS = {
    # Miles main 31f1ca961 (2026-08-21) with Megatron-LM miles-main 2e64d788b and its SGLang 0.5.16 fork.
    "miles-2026-08-21": Target("miles-2026-08-21", "31f1ca961", "0.5.16", "nsa", "glm_moe_dsa",
                               launcher="main-2026-08", megatron="2e64d788b"),
    "miles-0.0.2": Target("miles-0.0.2", "0.0.2", "bundled", "nsa", "glm_moe_dsa"),
    "sglang-0.5.23": Target("sglang-0.5.23", "main", "0.5.23", "dsa", "glm_moe_dsa", "cuda-graph-max-bs-decode"),
    # Seed 004's era: the older Miles that wanted a DeepseekV32 config.
    "miles-2026-05": Target("miles-2026-05", "2026-05", "bundled", "nsa", "deepseek_v32"),
}
DEFAULT_TARGET = "miles-2026-08-21"


@dataclass(frozen=True)
class TrainGrid:
    tp: int
    sp: bool
    pp: int
    pp_layers: tuple[int, ...]
    cp: int
    ep: int
    etp: int
    dp: int


@dataclass(frozen=True)
class RolloutLayout:
    engines: int
    gpus_per_engine: int
    tp: int  # SGLang's tp_size is the GPUs of one engine
    dp: int
    ep: int
    dp_attention: bool
    dense_tp_lm_head: bool  # --sglang-moe-dense-tp-size 1 --sglang-enable-dp-lm-head


@dataclass(frozen=True)
class Topology:
    case: str
    platform: str
    num_gpus: int
    mode: str
    gpus_per_node: int
    num_nodes: int
    actor_gpus: int
    rollout_gpus: int
    train: TrainGrid
    rollout: RolloutLayout
    target: Target
    explicit_split: bool = False  # actor_gpus / rollout_gpus were set rather than derived

    @property
    def actor_num_nodes(self) -> int:
        return max(1, math.ceil(self.actor_gpus / self.gpus_per_node))

    @property
    def actor_gpus_per_node(self) -> int:
        return min(self.actor_gpus, self.gpus_per_node)

    @property
    def ray_num_gpus(self) -> int:
        """What `ray start --num-gpus` is given on each node: every GPU a job of this plan uses there."""
        if self.mode == "colocate":
            return self.gpus_per_node
        return min(self.gpus_per_node, self.actor_gpus + self.rollout_gpus)

    @property
    def visible_devices(self) -> tuple[int, ...]:
        return tuple(range(self.gpus_per_node))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["train"]["pp_layers"] = list(self.train.pp_layers)
        d["target"] = self.target.name
        d["target_versions"] = {"miles": self.target.miles, "sglang": self.target.sglang}
        d.update(
            actor_num_nodes=self.actor_num_nodes,
            actor_gpus_per_node=self.actor_gpus_per_node,
            ray_num_gpus=self.ray_num_gpus,
            visible_devices=list(self.visible_devices),
        )
        return d


# --- defaults: per-family recipes, from the seeds -------------------------------------------------


def _largest_divisor(n: int, cap: int, must_divide: int) -> int:
    """The largest d <= cap with d | n and d | must_divide (at least 1)."""
    top = max(1, min(cap, n, must_divide) if must_divide > 0 else min(cap, n))
    return max(d for d in range(1, top + 1) if n % d == 0 and (must_divide == 0 or must_divide % d == 0))


def default_train(spec: ModelSpec, platform: str, mode: str, world: int, target: Target | None = None) -> dict:
    """Training grid defaults. The seeds' configurations are the fixed points of these rules."""
    if platform == "rocm" or mode == "async":
        # Seed 004 ROCm: the actor half trains with TP1 PP1 CP1 and EP over all of it.
        return dict(tp=1, pp=1, cp=1, ep=_largest_divisor(world, world, spec.num_experts), etp=1)
    long = spec.num_layers > 8
    if spec.family == "glm5.3-flash":
        # Seed 000: 32 GPUs as TP8 / PP4 / EP8 / CP1 (stages 11/11/11/12).
        tp = _largest_divisor(world, 8, spec.tp_divisor)
        pp = 4 if long and world >= 32 else 1
        return dict(tp=tp, pp=pp, cp=1, ep=_largest_divisor(world // pp, 8, spec.num_experts), etp=1)
    if spec.family == "glm4.5":
        # Seed 003: <= 32 GPUs TP4 PP1 CP1 EP4 (debug); 64 GPUs TP8 PP4 CP2 EP16.
        if long and world >= 64:
            return dict(tp=8, pp=4, cp=2, ep=16, etp=1)
        tp = _largest_divisor(world, 4, spec.tp_divisor)
        return dict(tp=tp, pp=1, cp=1, ep=_largest_divisor(world, 4, spec.num_experts), etp=1)
    # GLM-5, seed 004 NVIDIA: 8 GPUs as TP4+SP, CP2, EP8.
    tp = _largest_divisor(world, 4, spec.tp_divisor)
    pp = 4 if long and world >= 32 else 1
    if target and target.main:  # Miles main's launcher: CP1 (600ac7452), CP2 only for the full model on 16+ nodes
        cp = 2 if long and world >= 128 else 1
    else:
        cp = 2 if world // tp >= 2 else 1
    return dict(tp=tp, pp=pp, cp=cp, ep=_largest_divisor(world // pp, 8, spec.num_experts), etp=1)


def default_rollout(spec: ModelSpec, platform: str, mode: str, rollout_gpus: int) -> dict:
    if platform == "rocm" or mode == "async":
        # Seed 004 ROCm: engines of 2 GPUs, dp 2, ep 2 under dp-attention.
        gpe = min(2, rollout_gpus)
        return dict(gpus_per_engine=gpe, dp=gpe, ep=gpe, dense_tp_lm_head=False)
    if spec.family == "glm5.3-flash":
        gpe = min(8, rollout_gpus)  # seed 000: 8-GPU engines, TP8 / EP8
        return dict(gpus_per_engine=gpe, dp=1, ep=gpe, dense_tp_lm_head=False)
    if spec.family == "glm4.5" and rollout_gpus >= 32:
        return dict(gpus_per_engine=32, dp=4, ep=32, dense_tp_lm_head=True)  # seed 003
    gpe = min(DEFAULT_GPUS_PER_NODE, rollout_gpus)  # seed 004 NVIDIA: 1 engine x 8, dp 8, ep 8
    return dict(gpus_per_engine=gpe, dp=gpe, ep=gpe, dense_tp_lm_head=True)


def split_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Even stages with the remainder on the last ones: 45 over 4 gives 11/11/11/12."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i >= pp - extra else 0) for i in range(pp))


# --- overrides ------------------------------------------------------------------------------------

_INT, _BOOL, _LAYERS = "int", "bool", "layers"
SETTABLE: Mapping[str, str] = {
    "train.tp": _INT, "train.sp": _BOOL, "train.pp": _INT, "train.pp_layers": _LAYERS, "train.cp": _INT,
    "train.ep": _INT, "train.etp": _INT,
    "rollout.gpus_per_engine": _INT, "rollout.tp": _INT, "rollout.dp": _INT, "rollout.ep": _INT,
    "rollout.dp_attention": _BOOL, "rollout.dense_tp_lm_head": _BOOL,
    "actor_gpus": _INT, "rollout_gpus": _INT,
}  # fmt: skip


def parse_overrides(items: list[str] | Mapping[str, object]) -> dict[str, object]:
    """`KEY=VALUE` strings (or a mapping) to typed values. Unknown keys are an error, never ignored."""
    pairs = items.items() if isinstance(items, Mapping) else [_split_kv(s) for s in items]
    out: dict[str, object] = {}
    for key, raw in pairs:
        if key not in SETTABLE:
            raise UnknownNameError(
                f"--set {key}: unknown key", rule="set.known_key", fix=f"use one of: {', '.join(SETTABLE)}"
            )
        out[key] = _coerce(key, SETTABLE[key], raw)
    return out


def _split_kv(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise RlsmokeError(f"--set {item!r} is not KEY=VALUE", rule="set.syntax", fix="write e.g. --set rollout.dp=4")
    key, value = item.split("=", 1)
    return key.strip(), value.strip()


def _coerce(key: str, kind: str, raw: object) -> object:
    if not isinstance(raw, str):
        if kind == _LAYERS:
            return tuple(_in_range(key, int(n)) for n in raw)
        return _in_range(key, raw) if kind == _INT and isinstance(raw, int) and not isinstance(raw, bool) else raw
    try:
        if kind == _INT:
            number = int(raw)
        elif kind == _LAYERS:
            numbers = tuple(int(v) for v in raw.split(","))
    except ValueError:
        raise RlsmokeError(
            f"--set {key}={raw} is not {'an integer' if kind == _INT else 'a comma list of integers'}",
            rule="set.value",
            fix=f"give {key} a number",
        ) from None
    if kind == _INT:
        return _in_range(key, number)
    if kind == _LAYERS:
        return tuple(_in_range(key, n) for n in numbers)
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise RlsmokeError(f"--set {key}={raw} is not a boolean", rule="set.value", fix=f"use {key}=true or false")


def _in_range(key: str, value: int) -> int:
    if not 0 <= value <= MAX_NUM_GPUS:
        raise RlsmokeError(f"--set {key}={value} is outside [0, {MAX_NUM_GPUS}]", rule="set.range",
                           fix=f"give {key} a size within [0, {MAX_NUM_GPUS}]")  # fmt: skip
    return value


# --- the plan ------------------------------------------------------------------------------------


def parse_num_gpus(value: object) -> int:
    try:
        n = int(str(value))
    except ValueError:
        n = 0
        ok = False
    else:
        ok = n > 0
    if not ok:
        raise RlsmokeError(
            f"num_gpus={value!r} must be a positive integer", rule="gpus.positive", fix="pass --num-gpus N with N >= 1"
        )
    if n > MAX_NUM_GPUS:
        raise RlsmokeError(f"num_gpus={n} is past the largest plan, {MAX_NUM_GPUS} GPUs", rule="gpus.range",
                           fix=f"pass --num-gpus N with 1 <= N <= {MAX_NUM_GPUS}")  # fmt: skip
    return n


def check_gpus_per_node(value: int | None) -> None:
    """--gpus-per-node when given: 0 is a mistake, not the default."""
    if value is not None and not 1 <= value <= MAX_GPUS_PER_NODE:
        raise RlsmokeError(f"gpus_per_node={value} is outside [1, {MAX_GPUS_PER_NODE}]", rule="gpus.per_node",
                           fix=f"pass --gpus-per-node N with 1 <= N <= {MAX_GPUS_PER_NODE}, or leave it out "
                               f"(default {DEFAULT_GPUS_PER_NODE}, or NUM_GPUS when smaller)")  # fmt: skip


def plan_topology(
    spec: ModelSpec,
    platform: str,
    num_gpus: int | str,
    mode: str | None = None,
    overrides: Mapping[str, object] | list[str] = (),
    *,
    gpus_per_node: int | None = None,
    target: str = DEFAULT_TARGET,
    validate: bool = True,
) -> Topology:
    """Derive every parallel size and GPU count from NUM_GPUS, then validate (unless told not to)."""
    plat = get_platform(platform)
    num_gpus = parse_num_gpus(num_gpus)
    mode = mode or plat.default_mode
    if mode not in MODES:
        raise UnknownNameError(f"mode={mode!r} is unknown", rule="mode.known", fix=f"use one of: {', '.join(MODES)}")
    if target not in TARGETS:
        raise UnknownNameError(
            f"target={target!r} is unknown", rule="target.known", fix=f"use one of: {', '.join(TARGETS)}"
        )
    sets = parse_overrides(overrides)
    check_gpus_per_node(gpus_per_node)
    gpn = gpus_per_node or min(DEFAULT_GPUS_PER_NODE, num_gpus)

    if mode == "colocate":
        actor = rollout = num_gpus
    else:
        actor = num_gpus // 2
        rollout = num_gpus - actor
    actor = int(sets.get("actor_gpus", actor))
    rollout = int(sets.get("rollout_gpus", rollout))

    t = default_train(spec, plat.name, mode, max(actor, 1), TARGETS[target])
    t.update({k[6:]: v for k, v in sets.items() if k.startswith("train.")})
    t.setdefault("sp", t["tp"] > 1)
    t.setdefault("pp_layers", split_layers(spec.num_layers, t["pp"]) if t["pp"] > 0 else ())
    model_parallel = t["tp"] * t["cp"] * t["pp"]
    t["dp"] = actor // model_parallel if model_parallel > 0 else 0
    train = TrainGrid(**t)

    r = default_rollout(spec, plat.name, mode, max(rollout, 1))
    r.update({k[8:]: v for k, v in sets.items() if k.startswith("rollout.")})
    r.setdefault("tp", r["gpus_per_engine"])
    r.setdefault("dp_attention", r["dp"] > 1)
    r["engines"] = rollout // r["gpus_per_engine"] if r["gpus_per_engine"] > 0 else 0
    layout = RolloutLayout(**r)

    topo = Topology(
        case=spec.name, platform=plat.name, num_gpus=num_gpus, mode=mode, gpus_per_node=gpn,
        num_nodes=max(1, math.ceil(num_gpus / gpn)), actor_gpus=actor, rollout_gpus=rollout,
        train=train, rollout=layout, target=TARGETS[target],
        explicit_split="actor_gpus" in sets or "rollout_gpus" in sets,
    )  # fmt: skip
    if validate:
        found = violations(topo, spec)
        if found:
            rule_id, message, fix = found[0]
            values = single_fixes(topo, spec, sets, rule_id)
            if values:
                sets_ = [f"--set {kv}" for kv in values]
                which = sets_[0] if len(sets_) == 1 else f"any one of {', '.join(sets_)}"
                found[0] = (rule_id, message, f"{fix.rstrip('.')}: {which} fixes this plan.")
            if plat.name == "cpu":  # no Megatron or SGLang runs on CPU: the rules are the plan's own
                found = [(_plan_rule(r), m, f) for r, m, f in found]
            raise TopologyError(found)
    return topo


def _plan_rule(rule_id: str) -> str:
    head, _, rest = rule_id.partition(".")
    return f"plan.{rest}" if head in ("megatron", "sglang") else rule_id


# The keys whose one value can fix a rule; `single_fixes` tries each value and keeps those that plan.
FIX_KEYS: Mapping[str, tuple[str, ...]] = {
    "megatron.world_tp_cp_pp": ("train.tp", "train.cp", "train.pp"),
    "megatron.world_etp_ep_pp": ("train.ep", "train.etp", "train.pp"),
    "megatron.tp_divides_heads": ("train.tp",),
    "megatron.ep_divides_experts": ("train.ep",),
    "megatron.pp_stages_nonempty": ("train.pp",),
    "rollout.engine_multiple": ("rollout.gpus_per_engine",),
    "sglang.dp_divides_engine_gpus": ("rollout.dp",),
    "sglang.ep_divides_engine_gpus": ("rollout.ep",),
}
MAX_FIXES = 3


def single_fixes(failed: Topology, spec: ModelSpec, sets: Mapping[str, object], rule_id: str) -> list[str]:
    """`KEY=VALUE` changes of one key that make the whole plan valid, nearest the failing value first."""
    target = next(name for name, t in TARGETS.items() if t == failed.target)
    found = []
    for key in FIX_KEYS.get(rule_id, ()):
        group, field = key.split(".")
        current = int(getattr(failed.train if group == "train" else failed.rollout, field))
        for value in _candidates(failed, spec):
            if value == current:
                continue
            try:
                topo = plan_topology(spec, failed.platform, failed.num_gpus, failed.mode, {**sets, key: value},
                                     gpus_per_node=failed.gpus_per_node, target=target, validate=False)  # fmt: skip
            except RlsmokeError:
                continue
            if not violations(topo, spec):
                found.append((abs(value - current), len(found), f"{key}={value}"))
    return [kv for *_, kv in sorted(found)[:MAX_FIXES]]


def _candidates(topo: Topology, spec: ModelSpec) -> list[int]:
    """The sizes a single fix may take: every rule is a divisibility, so the divisors of the counts
    and of the model's heads and experts hold every value that can pass; the small sizes besides.
    Found in time of the square root of NUM_GPUS, not linear in it."""
    found = set(range(1, min(topo.num_gpus, 64) + 1))
    for n in (topo.num_gpus, topo.actor_gpus, topo.rollout_gpus, topo.rollout.gpus_per_engine, spec.num_experts,
              spec.tp_divisor):
        found |= _divisors(n)
    return sorted(v for v in found if 1 <= v <= topo.num_gpus)


def _divisors(n: int) -> set[int]:
    if not 0 < n <= MAX_NUM_GPUS:
        return set()
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return set(small) | {n // d for d in small}


# --- rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    id: str
    ok: Callable[[Topology, ModelSpec], bool]
    message: Callable[[Topology, ModelSpec], str]
    fix: str


def _divides(a: int, b: int) -> bool:
    return a > 0 and b % a == 0


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
    Rule(
        "megatron.tp_divides_heads",
        # Under GQA, TP may also be a multiple of the query groups (megatron-core replicates KV heads).
        lambda t, s: _divides(t.train.tp, s.num_attention_heads) and (
            s.attention != "gqa" or _divides(t.train.tp, s.num_query_groups)
            or (t.train.tp > 0 and t.train.tp % s.num_query_groups == 0)),
        lambda t, s: f"train.tp={t.train.tp} does not divide the attention heads ({s.num_attention_heads})"
        + (f", or neither divides nor is a multiple of the query groups ({s.num_query_groups})"
           if s.attention == "gqa" else ""),
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

RULE_IDS = ("gpus.positive",) + tuple(r.id for r in RULES)


def violations(topo: Topology, spec: ModelSpec) -> list[tuple[str, str, str]]:
    """Every rule that fails, as (rule id, message, fix)."""
    return [(r.id, r.message(topo, spec), r.fix) for r in RULES if not r.ok(topo, spec)]
