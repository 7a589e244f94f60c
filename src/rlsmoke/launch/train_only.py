"""Miles' trainer alone on rlsmoke's rollout: `rlsmoke run CASE --launcher miles --miles-root R --train-only`.

Miles main's `--load-debug-rollout-data PATH` trains on a recorded rollout and starts no SGLang engine
(`miles/utils/arguments.py` sets `debug_train_only`). The flow:

1. prepare: the HF checkpoint (`rlsmoke prepare`), under the model dir as `<case>`;
2. convert: HF -> torch_dist with R's `tools/convert_hf_to_torch_dist.py` (`flow.convert_step`), unless done;
3. rollout: the built-in engine samples the recipe's prompts and writes Miles' debug-rollout file
   (`engine.miles_rollout`): tokens, loss masks, dense target rewards, log-probs at --rollout-temperature;
4. ray-head: `ray start --head` with one GPU, no dashboard;
5. train: `python3 train.py <argv> --debug-train-only --load-debug-rollout-data PATH` in R, with
   `RAY_ADDRESS` at that head (Miles' placement group joins it) and `MILES_CI_GATE_RECORD_DIR` set;
6. gate: Miles' own `step 0: {...}` / `rollout 0: {...}` lines and its CiHistory JSONL, with the
   thresholds of the run's key (launcher miles).

`steps` is what `rlsmoke plan --launcher miles --train-only` prints; `run` runs them.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlsmoke.checkpoints.dialects import DIALECTS
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.launch import flow
from rlsmoke.launch.miles import RAY_GCS_PORT, Launch, Paths, flag_values
from rlsmoke.launch.train_only_argv import ray_head_train_only, train_only
from rlsmoke.metrics import CI_HISTORY
from rlsmoke.recipe import Recipe
from rlsmoke.shipped import FIXTURES

if TYPE_CHECKING:
    from rlsmoke.cases import Plan

TARGET = "miles-2026-08-21"  # Miles main at 31f1ca961: the commit whose train-only mode this drives
ROLLOUT_TEMPLATE = "rollout_data/{rollout_id}.pt"  # under the run's folder; Miles fills in the rollout's id
PROMPT_DATA = FIXTURES / "data" / "math.jsonl"
RAY_ADDRESS_VAR = "RAY_ADDRESS"  # Ray's placement_group() auto-initialises against it
STEP_TIMEOUT_S = 3600.0


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


def value(launch: Launch, flag: str) -> str:
    return next(v[0] for toks in launch.groups.values() for f, v in flag_values(toks) if f == flag)


def make_plan(case, *, paths: Paths, out: str, recipe: Recipe | None = None, tiny: bool = False, seed: int = 0,
              inject: str | None = None, repeat: int = 1) -> TrainOnlyPlan:  # fmt: skip
    """The case's plan at `repeat` rollouts, its launch made train-only (`train_only_argv.train_only`).
    --repeat K: one launch of K steps, step i on seed + i's rollout, K seeds for one start-up; step i's
    weights are i Adam steps of 1e-6 on, under a hundredth of a bf16 step at 0.02 (most have not moved)."""
    from dataclasses import replace

    from rlsmoke.launch.rollout_file import check_template

    recipe = replace(recipe or Recipe(), num_rollout=repeat)
    plan = case.plan(paths=paths, recipe=recipe)
    template = f"{out}/{ROLLOUT_TEMPLATE}"
    check_template(template)
    launch = train_only(plan.launch, rollout_template=template, prompt_data=str(PROMPT_DATA),
                        miles_root=paths.miles_root, uses_dsa="index_topk" in plan.spec.hf_extra)  # fmt: skip
    return TrainOnlyPlan(plan, launch, paths, out, tiny, seed, inject, repeat)


def rollout_step(tp: TrainOnlyPlan) -> flow.Step:
    hf = tp.plan.launch.hf_checkpoint
    launch = tp.launch
    argv = ("python3", "-m", "rlsmoke.miles_rollout", tp.plan.case.name, "--checkpoint", hf,
            "--out", tp.rollout_template, "--n-prompts", value(launch, "--rollout-batch-size"),
            "--n-samples", value(launch, "--n-samples-per-prompt"),
            "--max-response-len", value(launch, "--rollout-max-response-len"),
            "--temperature", value(launch, "--rollout-temperature"), "--seed", str(tp.seed),
            "--prompt-data", str(PROMPT_DATA), *(["--tiny"] if tp.tiny else []),
            *(["--inject", tp.inject] if tp.inject else []),
            *(["--repeat", str(tp.repeat)] if tp.repeat > 1 else []))  # fmt: skip
    return flow.Step("rollout", "the built-in engine's rollout as Miles' debug-rollout file", argv)


def steps(tp: TrainOnlyPlan) -> list[flow.Step]:
    hf = tp.plan.launch.hf_checkpoint
    prepare = ("rlsmoke", "prepare", tp.plan.case.name, "--out", hf, *(["--tiny"] if tp.tiny else []))
    if tp.plan.spec.hf_model_type in DIALECTS:
        prepare += ("--dialect", tp.plan.topology.target.checkpoint_dialect)
    head = tp.launch.master_addr
    return [
        flow.Step("prepare", "the HF checkpoint", prepare, skip_when=f"[ -e {shlex.quote(hf)} ]"),
        flow.convert_step(tp.plan, tp.paths),
        rollout_step(tp),
        flow.Step("ray-head", "Ray's head with one GPU, no dashboard", tuple(ray_head_train_only(tp.launch))),
        flow.Step(
            "train",
            "Miles' train.py on the rollout file, no SGLang",
            tuple(tp.launch.argv),
            {RAY_ADDRESS_VAR: f"{head}:{RAY_GCS_PORT}", flow.RECORD_DIR_VAR: tp.record_dir},
        ),
    ]


def shell_script(tp: TrainOnlyPlan) -> str:
    """The flow as a shell script run from the Miles checkout, one step after the other."""
    lines = ["#!/usr/bin/env bash", f"# rlsmoke plan {tp.plan.case.name} --launcher miles --train-only "
             f"--platform {tp.plan.topology.platform} --num-gpus 1 --target {tp.launch.target}", "set -euo pipefail"]  # fmt: skip
    lines += [f"export {k}={shlex.quote(v)}" for k, v in tp.launch.env.items()]
    for step in steps(tp):
        lines.append(f"# {step.name}: {step.what}" + (", unless done" if step.skip_when else ""))
        if step.name == "ray-head":  # it returns once the head is up; `ray stop` ends it afterwards
            lines.append(step.shell())
        elif step.name == "train":
            lines += [f"export {k}={shlex.quote(v)}" for k, v in step.env.items()]
            lines.append(shlex.join(tp.launch.argv[:2]) + " \\")
            body = [toks for toks in tp.launch.groups.values() if toks]
            lines += [
                "  " + shlex.join(toks) + (" \\" if i < len(body) - 1 else "") for i, toks in enumerate(body)
            ]
        else:
            lines.append(f"{step.skip_when} || {step.shell()}" if step.skip_when else step.shell())
    return "\n".join(lines)


# --- running it -----------------------------------------------------------------------------------------


def ray_head_argv(tp: TrainOnlyPlan, ports, temp_dir: str) -> list[str]:
    """The plan's head with our leased ports, our temp dir and `--block` (the head is our session's leader:
    stopping it stops this cluster only, never another one on the host)."""
    lo, hi = ports.worker_ports
    return [*ray_head_train_only(tp.launch), "--port", str(ports.gcs),
            "--node-manager-port", str(ports.node_manager), "--object-manager-port", str(ports.object_manager),
            "--runtime-env-agent-port", str(ports.runtime_env_agent), "--metrics-export-port", str(ports.metrics_export),
            "--dashboard-agent-listen-port", str(ports.dashboard_agent_listen),
            "--dashboard-agent-grpc-port", str(ports.dashboard_agent_grpc),
            "--min-worker-port", str(lo), "--max-worker-port", str(hi), "--temp-dir", temp_dir, "--block"]  # fmt: skip


def wait_port(port: int, head, timeout: float) -> None:
    """Until the head's GCS accepts connections; the head exiting first is an error with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.proc.poll() is not None:
            raise RuntimeError(
                f"`ray start` exited with {head.proc.returncode} before its GCS came up; see {head.log}"
            )
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"Ray's GCS on port {port} did not answer within {timeout:.0f} s; see {head.log}")


def run(tp: TrainOnlyPlan, *, miles_root: Path, env: dict, timeout: float = STEP_TIMEOUT_S, echo=None):
    """The pre-flight, convert (unless done), the rollout, Ray's head and Miles' train.py; the first step
    that fails ends the flow and its Result is returned. The HF checkpoint must be there (`prepare_hf`)."""
    import shutil
    import tempfile

    from rlsmoke.launch import preflight, runner
    from rlsmoke.launch.lease import lease_ports

    out = Path(tp.out)
    out.mkdir(parents=True, exist_ok=True)
    preflight.check_flags(tp.launch, miles_root)  # the user's Miles parses the argv before anything runs
    flow.check(tp.plan)
    failed = flow.convert(tp.plan, tp.paths, miles_root=miles_root, env=env, artifacts=out, timeout=timeout)
    if failed is not None:
        return failed
    rollout = rollout_step(tp)
    result = runner.run(rollout.command, env=runner.clean_env(env), log=out / "rollout.log", timeout=timeout)
    if not result.ok:
        return result
    ports = lease_ports()
    # as for the converter: the caller's PYTHONPATH stays, after Miles' checkout and Megatron
    search = os.pathsep.join(filter(None, [tp.launch.env["PYTHONPATH"], os.environ.get("PYTHONPATH")]))
    full_env = runner.clean_env({**tp.launch.env, **env, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": search})
    temp_dir = tempfile.mkdtemp(prefix="rlsmoke-ray-")  # Ray's unix sockets need a short path
    head = runner.Process(
        ray_head_argv(tp, ports, temp_dir), env=full_env, cwd=miles_root, log=out / "ray-head.log"
    )
    result = None
    try:
        wait_port(ports.gcs, head, timeout=min(120.0, timeout))
        train_env = {
            **full_env,
            RAY_ADDRESS_VAR: f"127.0.0.1:{ports.gcs}",
            flow.RECORD_DIR_VAR: tp.record_dir,
        }
        result = runner.run(tp.launch.argv, env=train_env, cwd=miles_root, log=out / "run.log", timeout=timeout,
                            echo=echo)  # fmt: skip
    finally:
        head_died = head.proc.poll() is not None
        head.stop(grace=runner.HEAD_GRACE_S)
        if head_died or result is None or not result.ok:  # Ray's own logs say what went wrong
            logs = Path(temp_dir) / "session_latest" / "logs"
            if logs.is_dir():
                shutil.copytree(
                    logs, out / "ray-logs", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock")
                )
        shutil.rmtree(temp_dir, ignore_errors=True)
        ports.release()
    return result


def prepare_hf(tp: TrainOnlyPlan) -> Path:
    """The HF checkpoint at `<model dir>/<case>`: verified when there, else prepared (cached) and linked."""
    from rlsmoke.checkpoints import prepare
    from rlsmoke.engine.model import checkpoint_dir

    hf = Path(tp.plan.launch.hf_checkpoint)
    name = tp.plan.case.name
    if hf.exists():
        return checkpoint_dir(name, tiny=tp.tiny, given=hf)
    dialect = tp.plan.topology.target.checkpoint_dialect if tp.plan.spec.hf_model_type in DIALECTS else None
    hf.parent.mkdir(parents=True, exist_ok=True)
    hf.symlink_to(prepare(name, tiny=tp.tiny, seed=0, dialect=dialect))
    return hf


# --- gating and the command -----------------------------------------------------------------------------


def rollout_info(out: Path) -> dict:
    """What the rollout step said it wrote (its device, dtype, means), from its log's last `rollout file:` line."""
    lines = [ln for ln in (out / "rollout.log").read_text().splitlines() if ln.startswith("rollout file: ")]
    return json.loads(lines[-1].removeprefix("rollout file: ")) if lines else {}


def write_summary(tp: TrainOnlyPlan, device: str) -> dict:
    """summary.json: the run's key (launcher miles, one GPU) and what it ran."""
    from rlsmoke.metrics import update_summary

    info = rollout_info(Path(tp.out))
    fields = {"case": tp.plan.case.name, "platform": tp.plan.topology.platform, "device": device,
              "launcher": "miles", "dtype": f"{info.get('dtype', 'bfloat16')}/float32",
              "width": "tiny" if tp.tiny else "full", "num_gpus": 1, "seed": tp.seed, "repeat": tp.repeat, "mode": "train-only",
              "inject": tp.inject or "none", "rollout_temperature": float(value(tp.launch, "--rollout-temperature")),
              "rollout": info, "miles_root": tp.paths.miles_root, "artifacts": tp.out}  # fmt: skip
    update_summary(tp.out, fields)
    return fields


def gate(out: Path):
    """Miles' logged metrics (run.log, checked against its CiHistory JSONL) against the thresholds of the
    run's key, each step as its seed's record (metrics.jsonl, `repeat` i for step i), as `rlsmoke run
    --repeat` gates its seeds; the verdict goes into summary.json."""
    from rlsmoke.artifacts import write_atomic
    from rlsmoke.metrics import KINDS, load_record
    from rlsmoke.repeats import gate_run

    record = load_record(out / "run.log")
    steps = sorted({i for kind in KINDS for i in record.entries.get(kind, {})})
    lines = [{"kind": kind, "index": 0, "repeat": i, "metrics": dict(record.entries[kind][i])}
             for i in steps for kind in KINDS if i in record.entries.get(kind, {})]  # fmt: skip
    write_atomic(out / "metrics.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    return gate_run(out)


def handler(args) -> int:
    """`rlsmoke run ... --launcher miles --train-only`: exit 0 every gate passed, 1 a gate failed, 2 bad
    input, 3 a step broke (its log named)."""
    from rlsmoke.artifacts import earlier_records
    from rlsmoke.cases import case_from_args
    from rlsmoke.checkpoints.cache_paths import cache_home
    from rlsmoke.miles_rollout import check_inject
    from rlsmoke.platforms import detect

    if not args.train_only:
        raise RlsmokeError("--launcher miles in `rlsmoke run` runs Miles' trainer alone", rule="run.launcher",
                           fix="add --train-only, or run Miles' whole flow with pytest --launcher miles")  # fmt: skip
    root = args.miles_root
    if root is None or not (Path(root) / "train.py").is_file():
        raise RlsmokeError(f"miles_root={root} is not a Miles checkout (no train.py)", rule="launcher.miles_root",
                           fix="pass --miles-root DIR, a checkout of radixark/miles")  # fmt: skip
    check_inject(args.inject)
    if args.repeat < 1:
        raise RlsmokeError(f"repeat={args.repeat}: a run has at least one seed", rule="run.repeat",
                           fix="pass --repeat K with K >= 1")  # fmt: skip
    host = detect()
    args.platform = args.platform or host.platform
    args.target = args.target or TARGET
    tiny = args.tiny if args.tiny is not None else args.platform == "cpu"
    case = case_from_args(args)
    out = Path(args.out or Path("rlsmoke-runs") / case.name / time.strftime("%Y%m%d-%H%M%S")).resolve()
    earlier_records(out, overwrite=args.overwrite)
    model_dir = args.model_dir or cache_home() / "miles-models" / ("tiny" if tiny else "full")
    paths = Paths(model_dir=str(Path(model_dir).resolve()), output_dir=str(out), miles_root=str(Path(root).resolve()),
                  megatron_root=args.megatron_root or Paths.megatron_root)  # fmt: skip
    recipe = Recipe(num_rollout=1, rollout_batch_size=args.n_prompts or 8, n_samples_per_prompt=args.n_samples or 8,
                    rollout_max_response_len=args.max_response_len or 100,
                    rollout_temperature=args.rollout_temperature)  # fmt: skip
    tp = make_plan(case, paths=paths, out=str(out), recipe=recipe, tiny=tiny, seed=args.seed, inject=args.inject,
                   repeat=args.repeat)  # fmt: skip
    prepare_hf(tp)
    result = run(tp, miles_root=Path(paths.miles_root), env={})
    if result is not None and not result.ok:
        what = "timed out" if result.timed_out else f"exited with {result.returncode}"
        tail = "\n".join(result.log.read_text(errors="replace").splitlines()[-20:])
        print(f"{tail}\nerror: [run.broke] `{' '.join(result.argv[:3])} ...` {what}; see {result.log}")
        return ExitCode.RUN_FAILED
    device = host.device if host.platform == case.platform else "CPU"
    write_summary(tp, device)
    verdict, seeds = gate(out)
    print(f"{case.name} launcher=miles train-only device={device} seed={args.seed} repeat={args.repeat} "
          f"inject={args.inject}")  # fmt: skip
    print(verdict.table() if args.repeat == 1 else seeds.table())
    print(verdict.report() if not verdict.passed else f"artifacts: {out}")  # the report names the artifacts
    return ExitCode.OK if verdict.passed else ExitCode.GATE_FAILED


def plan_handler(args) -> int:
    """`rlsmoke plan CASE --launcher miles --train-only`: every step, as a script (or --format json)."""
    from rlsmoke.cases import case_from_args

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
