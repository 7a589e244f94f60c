"""Miles' trainer alone on rlsmoke's rollout, run: `rlsmoke run CASE --launcher miles --miles-root R
--train-only`. The plan and its steps are `launch.train_only`'s; this runs them (the pre-flight, convert,
the rollout file, Ray's head, `train.py`), then gates Miles' logged metrics."""

from __future__ import annotations

import json
from pathlib import Path

from rlsmoke.artifacts import default_out, earlier_records, write_atomic
from rlsmoke.cases import case_from_args
from rlsmoke.checkpoints.cache_paths import cache_home
from rlsmoke.engine.megatron.flags import flag_value
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.launch import flow
from rlsmoke.launch.miles import Paths
from rlsmoke.launch.train_only import (
    NO_APEX,
    RAY_ADDRESS_VAR,
    STEP_TIMEOUT_S,
    TARGET,
    TrainOnlyPlan,
    make_plan,
    rollout_step,
    steps,
)
from rlsmoke.metrics import KINDS, load_record, update_summary
from rlsmoke.miles_rollout import check_inject
from rlsmoke.platforms import detect
from rlsmoke.processes import miles_flow, preflight, runner
from rlsmoke.processes.lease import lease_ports
from rlsmoke.recipe import Recipe
from rlsmoke.repeats import gate_run


def convert(tp: TrainOnlyPlan, timeout: float = STEP_TIMEOUT_S) -> runner.Result | None:
    """Miles' converter for the run (unless done), without apex as train.py; its Result when it failed."""
    out, root = Path(tp.out), Path(tp.paths.miles_root)
    out.mkdir(parents=True, exist_ok=True)
    return miles_flow.convert(
        tp.plan, tp.paths, miles_root=root, env={}, artifacts=out, timeout=timeout, extra=NO_APEX
    )


def run(tp: TrainOnlyPlan, *, timeout: float = STEP_TIMEOUT_S) -> runner.Result:
    """The pre-flight, convert (unless done), the rollout, Ray's head and Miles' train.py; the first step
    that fails ends the flow and its Result is returned. The HF checkpoint must be there (`prepare_hf`)."""
    out, miles_root = Path(tp.out), Path(tp.paths.miles_root)
    out.mkdir(parents=True, exist_ok=True)
    preflight.check_flags(tp.launch, miles_root)  # the user's Miles parses the argv before anything runs
    flow.check(tp.plan)
    if (failed := convert(tp, timeout)) is not None:
        return failed
    result = runner.run(
        rollout_step(tp).command, env=runner.clean_env(), log=out / "rollout.log", timeout=timeout
    )
    if not result.ok:
        return result
    ports = lease_ports()
    search = runner.path_before_callers(tp.launch.env["PYTHONPATH"])
    *_, head, train_step = steps(tp)  # commands and envs are the plan's; the ports are this run's lease
    full_env = runner.clean_env({**tp.launch.env, **runner.LOOPBACK_RAY, "PYTHONPATH": search, **head.env})
    train_env = {**full_env, **train_step.env, RAY_ADDRESS_VAR: f"127.0.0.1:{ports.gcs}"}

    def train() -> runner.Result:
        return runner.run(
            train_step.command, env=train_env, cwd=miles_root, log=out / "run.log", timeout=timeout
        )

    try:
        return runner.under_ray_head(head.command, ports, train, env=full_env,
                                     cwd=miles_root, artifacts=out, timeout=timeout)  # fmt: skip
    finally:
        ports.release()


def prepare_hf(tp: TrainOnlyPlan) -> None:
    """The HF checkpoint at `<model dir>/<case>`: verified when there, else prepared (cached) and linked."""
    from rlsmoke.checkpoints import prepare
    from rlsmoke.engine.model import checkpoint_dir

    hf = Path(tp.plan.launch.hf_checkpoint)
    name = tp.plan.case.name
    if hf.exists():
        checkpoint_dir(name, tiny=tp.tiny, given=hf)
    else:
        hf.parent.mkdir(parents=True, exist_ok=True)
        hf.symlink_to(prepare(name, tiny=tp.tiny, seed=0, dialect=flow.checkpoint_dialect(tp.plan)))


def write_summary(tp: TrainOnlyPlan, device: str) -> None:
    """summary.json: the run's key (launcher miles, one GPU) and what it ran; `rollout` is what the rollout
    step said it wrote (its device, dtype, means), from its log's last `rollout file:` line."""
    log = (Path(tp.out) / "rollout.log").read_text().splitlines()
    lines = [ln for ln in log if ln.startswith("rollout file: ")]
    info = json.loads(lines[-1].removeprefix("rollout file: ")) if lines else {}
    fields = {"case": tp.plan.case.name, "platform": tp.plan.topology.platform, "device": device,
              "launcher": "miles", "dtype": f"{info.get('dtype', 'bfloat16')}/float32",
              "width": "tiny" if tp.tiny else "full", "num_gpus": 1, "seed": tp.seed, "repeat": tp.repeat,
              "mode": "train-only", "inject": tp.inject or "none",
              "rollout_temperature": float(flag_value(tp.launch.argv, "--rollout-temperature")),
              "rollout": info, "miles_root": tp.paths.miles_root, "artifacts": tp.out}  # fmt: skip
    update_summary(tp.out, fields)


def gate(out: Path):
    """Miles' logged metrics (run.log, checked against its CiHistory JSONL) against the thresholds of the
    run's key, each step as its seed's record (metrics.jsonl, `repeat` i for step i), as `rlsmoke run
    --repeat` gates its seeds; the verdict goes into summary.json."""
    record = load_record(out / "run.log", require_ci_history=True)  # its Miles (main) records them
    step_ids = sorted({i for kind in KINDS for i in record.entries.get(kind, {})})
    lines = [{"kind": kind, "index": 0, "repeat": i, "metrics": dict(record.entries[kind][i])}
             for i in step_ids for kind in KINDS if i in record.entries.get(kind, {})]  # fmt: skip
    write_atomic(out / "metrics.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    return gate_run(out)


def plan_of_args(args, host_platform: str) -> TrainOnlyPlan:
    """The run's plan from `rlsmoke run`'s arguments (the --out folder checked for earlier records)."""
    args.platform = args.platform or host_platform
    args.target = args.target or TARGET
    tiny = args.tiny if args.tiny is not None else args.platform == "cpu"
    case = case_from_args(args)
    out = (args.out or default_out(case.name)).resolve()
    earlier_records(out, overwrite=args.overwrite)
    model_dir = args.model_dir or cache_home() / "miles-models" / ("tiny" if tiny else "full")
    paths = Paths(model_dir=str(Path(model_dir).resolve()), output_dir=str(out),
                  miles_root=str(Path(args.miles_root).resolve()),
                  megatron_root=args.megatron_root or Paths.megatron_root)  # fmt: skip
    recipe = Recipe(num_rollout=1, rollout_batch_size=args.n_prompts or 8, n_samples_per_prompt=args.n_samples or 8,
                    rollout_max_response_len=args.max_response_len or 100,
                    rollout_temperature=args.rollout_temperature)  # fmt: skip
    return make_plan(case, paths=paths, out=str(out), recipe=recipe, tiny=tiny, seed=args.seed, inject=args.inject,
                     repeat=args.repeat)  # fmt: skip


def handler(args) -> int:
    """`rlsmoke run ... --launcher miles --train-only`: exit 0 every gate passed, 1 a gate failed, 2 bad
    input, 3 a step broke (its log named)."""
    if not args.train_only:
        raise RlsmokeError("--launcher miles in `rlsmoke run` runs Miles' trainer alone", rule="run.launcher",
                           fix="add --train-only, or run Miles' whole flow with pytest --launcher miles")  # fmt: skip
    if (root := args.miles_root) is None or not (Path(root) / "train.py").is_file():
        raise RlsmokeError(f"miles_root={root} is not a Miles checkout (no train.py)", rule="launcher.miles_root",
                           fix="pass --miles-root DIR, a checkout of radixark/miles")  # fmt: skip
    check_inject(args.inject)
    if args.repeat < 1:
        raise RlsmokeError(f"repeat={args.repeat}: a run has at least one seed", rule="run.repeat",
                           fix="pass --repeat K with K >= 1")  # fmt: skip
    host = detect()
    tp = plan_of_args(args, host.platform)
    prepare_hf(tp)
    if not (result := run(tp)).ok:
        what = "timed out" if result.timed_out else f"exited with {result.returncode}"
        print(result.tail(20))
        print(f"error: [run.broke] `{' '.join(result.argv[:3])} ...` {what}; see {result.log}")
        return ExitCode.RUN_FAILED
    case, out = tp.plan.case, Path(tp.out)
    device = host.device if host.platform == case.platform else "CPU"
    write_summary(tp, device)
    verdict, seeds = gate(out)
    print(f"{case.name} launcher=miles train-only device={device} seed={args.seed} repeat={args.repeat} "
          f"inject={args.inject}")  # fmt: skip
    print(verdict.table() if args.repeat == 1 else seeds.table())
    print(verdict.report() if not verdict.passed else f"artifacts: {out}")  # the report names the artifacts
    return ExitCode.OK if verdict.passed else ExitCode.GATE_FAILED
