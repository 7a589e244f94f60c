"""Miles' trainer alone on rlsmoke's rollout: `rlsmoke run CASE --launcher miles --miles-root R --train-only`.

Miles main's `--load-debug-rollout-data PATH` trains on a recorded rollout and starts no SGLang engine
(`miles/utils/arguments.py` sets `debug_train_only`). `steps` are the flow: prepare the HF checkpoint,
convert it to torch_dist with R's converter (unless done), write the built-in engine's rollout as Miles'
debug-rollout file (`rlsmoke.miles_rollout`), start Ray's head with one GPU, then run R's `train.py` on
that file. `rlsmoke plan --launcher miles --train-only` prints them; `processes.train_only` runs them and
gates Miles' own logged metrics with the thresholds of launcher miles.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace

from rlsmoke.cases import Plan, case_from_args
from rlsmoke.engine.megatron.flags import flag_value
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.launch import flow
from rlsmoke.launch.miles import RAY_GCS_PORT, Launch, Paths, flag_values
from rlsmoke.launch.rollout_file import check_template
from rlsmoke.metrics import CI_HISTORY
from rlsmoke.recipe import Recipe
from rlsmoke.shipped import FIXTURES

TARGET = "miles-2026-08-21"  # Miles main at 31f1ca961: the commit whose train-only mode this drives
ROLLOUT_TEMPLATE = "rollout_data/{rollout_id}.pt"  # under the run's folder; Miles fills in the rollout's id
PROMPT_DATA = FIXTURES / "data" / "math.jsonl"
RAY_ADDRESS_VAR = "RAY_ADDRESS"  # Ray's placement_group() auto-initialises against it
STEP_TIMEOUT_S = 3600.0
# What a train-only launch drops from the rendered one, and why: no SGLang engine is started, so none of
# its flags; one GPU that trains only, so nothing to colocate with (and --colocate forces
# torch_memory_saver's LD_PRELOAD); no checkpoint written after the step (a one-step smoke resumes
# nothing, and its optimizer state would not fit the disk); without --load Miles loads --ref-load as a
# fresh run does (no_load_optim, finetune); no --dump-details, which would save the rollout file it was
# given once more, with a parquet sidecar through polars, which Miles' site on the H200 has only as a stand-in.
TRAIN_ONLY_DROPPED = ("--colocate", "--rematerialize-param-from-master-weight", "--moe-enable-deepep",
                      "--load", "--save", "--save-interval", "--dump-details")  # fmt: skip
# What it sets instead: TE's cuDNN fused attention (flash-attn has no binary wheel), the all-to-all MoE
# dispatcher (DeepEP's flex dispatcher needs deep_ep), and no gradient-accumulation fusion, which needs
# apex's CUDA extension (not on the package index): the converter's model build refuses it too.
NO_APEX = ("--no-gradient-accumulation-fusion",)
TRAIN_ONLY_SET = {
    "--attention-backend": ("fused",),
    "--moe-token-dispatcher-type": ("alltoall",),
    NO_APEX[0]: (),
    "--prompt-data": (str(PROMPT_DATA),),  # the rollout's prompts: Miles' data source still reads them
}
# GLM-5's DSA top-k takes 2048 tokens of a packed micro-batch
DSA_PAD = ("--data-pad-size-multiplier", "4096")


@dataclass(frozen=True)
class TrainOnlyPlan:
    plan: Plan  # the case's rendered launch
    launch: Launch  # the train-only launch
    paths: Paths
    out: str  # the run's folder: the rollout file, the records
    tiny: bool = False
    seed: int = 0
    inject: str | None = None
    repeat: int = 1  # seeds: rollout i is seed + i, Miles' step i trains on it

    @property
    def rollout_template(self) -> str:
        return f"{self.out}/{ROLLOUT_TEMPLATE}"

    @property
    def record_dir(self) -> str:
        return f"{self.out}/{CI_HISTORY}"


def train_only(launch: Launch, *, rollout_template: str, miles_root: str, uses_dsa: bool) -> Launch:
    """`launch` as Miles' trainer alone: `train.py --debug-train-only --load-debug-rollout-data TEMPLATE`
    on the one GPU of the plan, the rollout's prompts as --prompt-data (Miles' data source still reads it),
    the checkout on PYTHONPATH (Ray's workers import `miles` from it)."""
    if launch.ray_num_gpus != 1 or launch.num_nodes != 1:
        raise RlsmokeError(f"a train-only launch on {launch.ray_num_gpus} GPUs: it trains on one", rule="miles.train_only",
                           fix="pass --num-gpus 1")  # fmt: skip
    groups: dict[str, list[str]] = {}
    for group, toks in launch.groups.items():
        out: list[str] = []
        for flag, values in flag_values(toks) if group != "sglang" else []:
            if flag not in TRAIN_ONLY_DROPPED:
                out += [flag, *TRAIN_ONLY_SET.get(flag, values)]
        groups[group] = out
    present = {flag for toks in groups.values() for flag, _ in flag_values(toks)}
    groups["misc"] += [
        tok for flag, values in TRAIN_ONLY_SET.items() if flag not in present for tok in (flag, *values)
    ]
    if uses_dsa and DSA_PAD[0] not in present:
        groups["perf"] += list(DSA_PAD)
    groups["rollout"] += ["--debug-train-only", "--load-debug-rollout-data", rollout_template]
    env = dict(launch.env)
    env["PYTHONPATH"] = ":".join([miles_root, env["PYTHONPATH"]])
    return Launch("train.py", groups, env, 1, launch.master_addr, 1, launch.target)


def ray_head_train_only(launch: Launch) -> list[str]:
    """Ray's head for a train-only run: no dashboard and no job submission, which only Miles' launcher uses."""
    return [*launch.ray_start(), "--include-dashboard=false"]


def make_plan(case, *, paths: Paths, out: str, recipe: Recipe | None = None, tiny: bool = False, seed: int = 0,
              inject: str | None = None, repeat: int = 1) -> TrainOnlyPlan:  # fmt: skip
    """The case's plan at `repeat` rollouts, its launch made train-only (`train_only`).
    --repeat K: one launch of K steps, step i on seed + i's rollout, K seeds for one start-up; step i's
    weights are i Adam steps of 1e-6 on, under a hundredth of a bf16 step at 0.02 (most have not moved)."""
    recipe = replace(recipe or Recipe(), num_rollout=repeat)
    plan = case.plan(paths=paths, recipe=recipe)
    template = f"{out}/{ROLLOUT_TEMPLATE}"
    check_template(template)
    launch = train_only(plan.launch, rollout_template=template, miles_root=paths.miles_root,
                        uses_dsa="index_topk" in plan.spec.hf_extra)  # fmt: skip
    return TrainOnlyPlan(plan, launch, paths, out, tiny, seed, inject, repeat)


def rollout_step(tp: TrainOnlyPlan) -> flow.Step:
    hf = tp.plan.launch.hf_checkpoint
    train = tp.launch.argv
    argv = ("python3", "-m", "rlsmoke.miles_rollout", tp.plan.case.name, "--checkpoint", hf,
            "--out", tp.rollout_template, "--n-prompts", flag_value(train, "--rollout-batch-size"),
            "--n-samples", flag_value(train, "--n-samples-per-prompt"),
            "--max-response-len", flag_value(train, "--rollout-max-response-len"),
            "--temperature", flag_value(train, "--rollout-temperature"), "--seed", str(tp.seed),
            "--prompt-data", str(PROMPT_DATA), *(["--tiny"] if tp.tiny else []),
            *(["--inject", tp.inject] if tp.inject else []),
            *(["--repeat", str(tp.repeat)] if tp.repeat > 1 else []))  # fmt: skip
    return flow.Step("rollout", "the built-in engine's rollout as Miles' debug-rollout file", argv)


def steps(tp: TrainOnlyPlan) -> list[flow.Step]:
    # the head's env too: Miles' train actor is its worker, and CiHistoryBackend reads the record dir there
    record = {flow.RECORD_DIR_VAR: tp.record_dir}
    train_env = {RAY_ADDRESS_VAR: f"{tp.launch.master_addr}:{RAY_GCS_PORT}", **record}
    head = tuple(ray_head_train_only(tp.launch))
    return [
        flow.prepare_step(tp.plan, "the HF checkpoint", tiny=tp.tiny),
        flow.convert_step(tp.plan, tp.paths, NO_APEX),
        rollout_step(tp),
        flow.Step("ray-head", "Ray's head with one GPU, no dashboard", head, record),
        flow.Step(
            "train", "Miles' train.py on the rollout file, no SGLang", tuple(tp.launch.argv), train_env
        ),
    ]


def shell_script(tp: TrainOnlyPlan) -> str:
    """The flow as a shell script run from the Miles checkout, one step after the other."""
    lines = ["#!/usr/bin/env bash", f"# rlsmoke plan {tp.plan.case.name} --launcher miles --train-only "
             f"--platform {tp.plan.topology.platform} --num-gpus 1 --target {tp.launch.target}", "set -euo pipefail"]  # fmt: skip
    lines += [f"export {k}={shlex.quote(v)}" for k, v in tp.launch.env.items()]
    for step in steps(tp):
        lines.append(f"# {step.name}: {step.what}" + (", unless done" if step.skip_when else ""))
        if step.name == "train":
            lines += [f"export {k}={shlex.quote(v)}" for k, v in step.env.items()]
            lines += tp.launch.script_lines()
        else:
            lines.append(f"{step.skip_when} || {step.shell()}" if step.skip_when else step.shell())
    return "\n".join(lines)


def plan_handler(args) -> int:
    """`rlsmoke plan CASE --launcher miles --train-only`: every step, as a script (or --format json)."""
    args.target = args.target or TARGET
    out = "<OUTPUT_DIR>/" + args.case
    paths = Paths(output_dir=out)
    tp = make_plan(
        case_from_args(args), paths=paths, out=out, recipe=Recipe(num_rollout=1, reward=args.reward)
    )
    if args.format == "json":
        print(json.dumps({"launch": {"argv": tp.launch.argv, "env": tp.launch.env},
                          "steps": [s.to_json() for s in steps(tp)]}, indent=2))  # fmt: skip
    else:
        print(shell_script(tp))
    return ExitCode.OK
