"""A case is (model × platform × NUM_GPUS); its plan is the validated topology plus the launch."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlsmoke.facts import DEFAULT_GPUS_PER_NODE, DEFAULT_MODE, MODES, PLATFORMS, in_words
from rlsmoke.models import ModelSpec, model_spec
from rlsmoke.overrides import parse_num_gpus, parse_overrides
from rlsmoke.recipe import Recipe
from rlsmoke.targets import DEFAULT_TARGET, TARGETS
from rlsmoke.topology import Topology, plan_topology

if TYPE_CHECKING:  # the launch is rendered by plan() only: `rlsmoke run` never imports it
    from rlsmoke.launch.miles import Launch, Paths


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

    def plan(
        self, *, validate: bool = True, paths: Paths | None = None, recipe: Recipe | None = None
    ) -> Plan:
        from rlsmoke.launch.miles import Paths, render

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


def add_case_arg(p: argparse.ArgumentParser) -> None:
    """The case positional, spelled alike by every verb; an unknown name is the `case.known` error."""
    p.add_argument("case", metavar="CASE", help="case name (see `rlsmoke cases`)")


def add_tiny_arg(p: argparse._ActionsContainer, default: str) -> None:
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction,
                   help=f"the tiny width of the case, seconds on a CPU (default: {default})")  # fmt: skip


def add_case_args(p: argparse.ArgumentParser, *, detect_platform: bool = False) -> None:
    """The case flags shared by `plan` and `run`. `run` detects the platform; a plan never does."""
    add_case_arg(p)
    detected = " (default: detected: nvidia-smi, then rocm-smi, else cpu)" if detect_platform else ""
    p.add_argument("--platform", required=not detect_platform, help=" | ".join(PLATFORMS) + detected)
    p.add_argument("--num-gpus", help="total GPUs (NUM_GPUS); every parallel size derives from it")
    p.add_argument("--mode", help=f"{' | '.join(MODES)} (default: {in_words(DEFAULT_MODE)})")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a derived value, e.g. rollout.dp=4 or train.ep=3")  # fmt: skip
    p.add_argument(
        "--gpus-per-node", type=int, help=f"default: {DEFAULT_GPUS_PER_NODE}, or NUM_GPUS when smaller"
    )
    p.add_argument(
        "--target",
        help=f"Miles/SGLang versions to render flags for: {' | '.join(TARGETS)} (default {DEFAULT_TARGET})",
    )


def case_from_args(args, *, tiny: bool = False) -> Case:
    model_spec(args.case)  # unknown case: a named error before anything else
    num_gpus = parse_num_gpus(args.num_gpus if args.num_gpus is not None else 1)
    case = Case(args.case, platform=args.platform, num_gpus=num_gpus, mode=args.mode,
                gpus_per_node=args.gpus_per_node, target=args.target or DEFAULT_TARGET, tiny=tiny)  # fmt: skip
    return case.with_overrides(args.sets)
