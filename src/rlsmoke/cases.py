"""A case is (model × platform × NUM_GPUS); its plan is the validated topology plus the launch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlsmoke.launch.miles import Launch, Paths, Recipe, render
from rlsmoke.models import MODEL_NAMES, ModelSpec, model_spec
from rlsmoke.topology import DEFAULT_TARGET, Topology, parse_overrides, plan_topology

CASE_NAMES = MODEL_NAMES


@dataclass(frozen=True)
class Case:
    name: str
    platform: str = "cpu"
    num_gpus: int = 1
    mode: str | None = None  # None: the platform's default (colocate on NVIDIA, async on ROCm)
    overrides: tuple[tuple[str, object], ...] = ()
    gpus_per_node: int | None = None
    target: str = DEFAULT_TARGET
    tiny: bool = False

    def spec(self) -> ModelSpec:
        return model_spec(self.name, tiny=self.tiny)

    def with_overrides(self, items: list[str]) -> Case:
        merged = dict(self.overrides) | parse_overrides(items)
        return dataclasses.replace(self, overrides=tuple(merged.items()))

    def plan(self, *, validate: bool = True, paths: Paths | None = None, recipe: Recipe | None = None) -> Plan:
        spec = model_spec(self.name)  # plans are always rendered at full width: that is what Miles runs
        topo = plan_topology(
            spec, self.platform, self.num_gpus, self.mode, dict(self.overrides),
            gpus_per_node=self.gpus_per_node, target=self.target, validate=validate,
        )  # fmt: skip
        return Plan(self, spec, topo, render(spec, topo, paths or Paths(), recipe or Recipe()))


@dataclass(frozen=True)
class Plan:
    case: Case
    spec: ModelSpec
    topology: Topology
    launch: Launch = field(repr=False)

    def to_json(self) -> dict:
        return {
            "case": self.case.name,
            "argv": self.launch.argv,
            "env": self.launch.env,
            "groups": self.launch.groups,
            "ray_start": self.launch.ray_start(),
            "checkpoint_dialect": self.topology.target.checkpoint_dialect,
            "topology": self.topology.to_dict(),
        } | ({"nodes": self.launch.nodes()} if self.launch.num_nodes > 1 else {})
