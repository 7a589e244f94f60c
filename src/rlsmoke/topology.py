"""Topology: one pure function from (model, platform, NUM_GPUS, mode, overrides) to a validated plan.
Every count in a launch comes from here, derived unless set; all rule failures are reported together,
the first with the one-key changes that fix the whole plan."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace

from rlsmoke.errors import TopologyError, require_known
from rlsmoke.facts import DEFAULT_GPUS_PER_NODE, DEFAULT_MODE, MODES
from rlsmoke.models import ModelSpec
from rlsmoke.overrides import MAX_NUM_GPUS, check_gpus_per_node, parse_num_gpus, parse_overrides
from rlsmoke.platforms import get_platform
from rlsmoke.targets import DEFAULT_TARGET, TARGETS, Target
from rlsmoke.topology_rules import ENGINE_RULES, violations


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
        d |= {k: getattr(self, k) for k in ("actor_num_nodes", "actor_gpus_per_node", "ray_num_gpus")}
        d["visible_devices"] = list(self.visible_devices)
        return d


# --- defaults: per-family recipes, from the seeds -------------------------------------------------


def _largest_divisor(n: int, cap: int, must_divide: int) -> int:
    """The largest d <= cap with d | n and d | must_divide (at least 1)."""
    top = max(1, min(cap, n, must_divide) if must_divide > 0 else min(cap, n))
    return max(d for d in range(1, top + 1) if n % d == 0 and (must_divide == 0 or must_divide % d == 0))


def default_train(spec: ModelSpec, platform: str, mode: str, world: int, target: Target) -> dict:
    """Training grid defaults: the family's grid (`ModelSpec.grid`), whose fixed points are its seed's."""
    if platform == "rocm" or mode == "async":
        # Seed 004 ROCm: the actor half trains with TP1 PP1 CP1 and EP over all of it.
        return dict(tp=1, pp=1, cp=1, ep=_largest_divisor(world, world, spec.num_experts), etp=1)
    g, long = spec.grid, spec.num_layers > 8
    if g.whole_from and long and world >= g.whole_from:
        return dict(g.whole, etp=1)
    tp = _largest_divisor(world, g.tp, spec.tp_divisor)
    pp = g.pp if long and g.pp_from and world >= g.pp_from else 1
    if target.main:
        cp = g.cp if g.main_cp_from and long and world >= g.main_cp_from else 1
    else:
        cp = g.cp if world // tp >= g.cp else 1
    return dict(tp=tp, pp=pp, cp=cp, ep=_largest_divisor(world // pp, g.ep, spec.num_experts), etp=1)


def default_rollout(
    spec: ModelSpec, platform: str, mode: str, rollout_gpus: int, gpus_per_engine: int | None = None
) -> dict:
    """The engines' layout: the family's (ROCm and async: seed 004's engines of 2 GPUs, dp 2, ep 2 under
    dp-attention), each engine's tp, dp and ep its GPUs. Unless set, an engine takes the most GPUs up to
    the family's size that SGLang can shard the model over and that tile the rollout GPUs."""
    g = spec.grid
    rocm = platform == "rocm" or mode == "async"
    dp_attention, lm_head = (True, False) if rocm else (g.rollout_dp, g.dense_tp_lm_head)
    if gpus_per_engine is None and not rocm and g.rollout_whole_from and rollout_gpus >= g.rollout_whole_from:
        return dict(g.rollout_whole, dense_tp_lm_head=lm_head)

    def layout(gpe: int) -> dict:
        return dict(gpus_per_engine=gpe, dp=gpe if dp_attention else 1, ep=gpe, dense_tp_lm_head=lm_head)

    if gpus_per_engine is not None:
        return layout(gpus_per_engine)
    for gpe in range(min(2 if rocm else g.engine_gpus, rollout_gpus), 1, -1):
        r = layout(gpe)
        engines = RolloutLayout(**r, engines=rollout_gpus // gpe, tp=gpe, dp_attention=r["dp"] > 1)
        shape = SimpleNamespace(rollout=engines, rollout_gpus=rollout_gpus)
        if all(rule.ok(shape, spec) for rule in ENGINE_RULES):
            return r
    return layout(1)


def split_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Even stages with the remainder on the last ones: 45 over 4 gives 11/11/11/12."""
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if i >= pp - extra else 0) for i in range(pp))


# --- the plan ------------------------------------------------------------------------------------


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
    get_platform(platform)
    num_gpus = parse_num_gpus(num_gpus)
    mode = mode or DEFAULT_MODE[platform]
    require_known("mode", mode, MODES)
    require_known("target", target, TARGETS)
    sets = parse_overrides(overrides)
    check_gpus_per_node(gpus_per_node)
    gpn = gpus_per_node or min(DEFAULT_GPUS_PER_NODE, num_gpus)

    half = num_gpus // 2
    actor, rollout = (num_gpus, num_gpus) if mode == "colocate" else (half, num_gpus - half)
    actor, rollout = int(sets.get("actor_gpus", actor)), int(sets.get("rollout_gpus", rollout))

    t = default_train(spec, platform, mode, max(actor, 1), TARGETS[target])
    t.update({k[6:]: v for k, v in sets.items() if k.startswith("train.")})
    t.setdefault("sp", t["tp"] > 1)
    t.setdefault("pp_layers", split_layers(spec.num_layers, t["pp"]) if t["pp"] > 0 else ())
    model_parallel = t["tp"] * t["cp"] * t["pp"]
    t["dp"] = actor // model_parallel if model_parallel > 0 else 0
    train = TrainGrid(**t)

    gpe = sets.get("rollout.gpus_per_engine")  # an int once parsed
    r = default_rollout(spec, platform, mode, max(rollout, 1), gpe if isinstance(gpe, int) else None)
    r.update({k[8:]: v for k, v in sets.items() if k.startswith("rollout.")})
    r.setdefault("tp", r["gpus_per_engine"])
    r.setdefault("dp_attention", r["dp"] > 1)
    r["engines"] = rollout // r["gpus_per_engine"] if r["gpus_per_engine"] > 0 else 0

    topo = Topology(
        case=spec.name, platform=platform, num_gpus=num_gpus, mode=mode, gpus_per_node=gpn,
        num_nodes=max(1, math.ceil(num_gpus / gpn)), actor_gpus=actor, rollout_gpus=rollout,
        train=train, rollout=RolloutLayout(**r), target=TARGETS[target],
        explicit_split="actor_gpus" in sets or "rollout_gpus" in sets,
    )  # fmt: skip
    if not (found := violations(topo, spec) if validate else []):
        return topo
    rule_id, message, fix = found[0]
    if values := single_fixes(topo, spec, sets, rule_id):
        sets_ = [f"--set {kv}" for kv in values]
        which = sets_[0] if len(sets_) == 1 else f"any one of {', '.join(sets_)}"
        found[0] = (rule_id, message, f"{fix.rstrip('.')}: {which} fixes this plan.")
    if platform == "cpu":  # no Megatron or SGLang runs on CPU: the rules are the plan's own
        found = [(re.sub(r"^(megatron|sglang)\.", "plan.", r), m, f) for r, m, f in found]
    raise TopologyError(found)


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
    "sglang.ep_divides_experts": ("rollout.gpus_per_engine", "rollout.ep"),
    "sglang.moe_tp_divides_moe_ffn": ("rollout.ep", "rollout.gpus_per_engine"),
    "sglang.attn_tp_divides_heads": ("rollout.gpus_per_engine", "rollout.dp"),
}
MAX_FIXES = 3


def single_fixes(failed: Topology, spec: ModelSpec, sets: Mapping[str, object], rule_id: str) -> list[str]:
    """`KEY=VALUE` changes of one key that make the whole plan valid, nearest the failing value first."""
    found = []
    for key in FIX_KEYS.get(rule_id, ()):
        group, field = key.split(".")
        current = int(getattr(failed.train if group == "train" else failed.rollout, field))
        for value in _candidates(failed, spec):
            if value == current:
                continue
            # every input but the changed size was checked by the failed plan, and the candidates are in range
            topo = plan_topology(spec, failed.platform, failed.num_gpus, failed.mode, {**sets, key: value},
                                 gpus_per_node=failed.gpus_per_node, target=failed.target.name,
                                 validate=False)  # fmt: skip
            if not violations(topo, spec):
                found.append((abs(value - current), len(found), f"{key}={value}"))
    return [kv for *_, kv in sorted(found)[:MAX_FIXES]]


def _candidates(topo: Topology, spec: ModelSpec) -> list[int]:
    """The sizes a single fix may take: the divisors of the counts, heads and experts, found in sqrt time."""
    gpus = (topo.num_gpus, topo.actor_gpus, topo.rollout_gpus, topo.rollout.gpus_per_engine)
    found = set(range(1, min(topo.num_gpus, 64) + 1))
    for n in (*gpus, spec.num_experts, spec.tp_divisor):
        if 0 < n <= MAX_NUM_GPUS:
            small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
            found |= set(small) | {n // d for d in small}
    return sorted(v for v in found if 1 <= v <= topo.num_gpus)
