"""`rlsmoke run`: one GRPO step of a case on the built-in engine, then its gates (evaluated here, once;
with --records-only the caller gates).

Exit codes: 0 every gate passed, 1 a gate failed, 2 bad input (incl. a missing checkpoint and OOM),
3 the run broke (NaN, a crashed worker), 143 stopped by SIGTERM (130 by Ctrl-C): the workers and the
Ray cluster the run started are stopped and run.log ends with "interrupted".
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rlsmoke.cases import add_case_args, add_tiny_arg, case_from_args
from rlsmoke.engine.config import BUILTIN_ASYNC_GPUS, RunConfig, dtype_name, parse_inject
from rlsmoke.errors import ExitCode, Interrupted, RlsmokeError, RunError
from rlsmoke.metrics import seed_records, update_summary
from rlsmoke.platforms import detect, get_platform
from rlsmoke.recipe import BatchShape
from rlsmoke.repeats import SeedVerdicts
from rlsmoke.runkey import RunKey, default_dtype
from rlsmoke.thresholds import Verdict, lookup_gates
from rlsmoke.topology import plan_topology


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run one GRPO step on the built-in engine and check its gates")
    add_case_args(p, detect_platform=True)
    g = p.add_argument_group("engine")
    add_tiny_arg(g, "on for --platform cpu, off otherwise")
    g.add_argument(
        "--rollout-dtype", default=None, help="float32 | bfloat16 (default: float32 on CPU, bfloat16 on GPU)"
    )
    g.add_argument(
        "--train-dtype", default="float32", help="master weights and optimizer state (default float32)"
    )
    g.add_argument(
        "--inject",
        default=None,
        metavar="FAULT",
        help="temperature-mismatch | stale-weights | rollout-noise=SIGMA | train-dropout=P | "
             "bridge-kv-order | bridge-expert-swap | bridge-gate-up-order (with --trainer megatron)",
    )
    g.add_argument("--compute-dtype", default=None,
                   help="the trainer's forward/backward dtype over the master weights (default: the rollout "
                        "dtype on GPUs, as Megatron's bf16 training; the train dtype on CPU)")
    g.add_argument("--compute-path", default="params", choices=("params", "autocast"),
                   help="params: a copy of the weights in the compute dtype over fp32 main parameters, as "
                        "Megatron trains (default); autocast: autocast over the fp32 weights")
    g.add_argument("--rollout-temperature", type=float, default=1.0, help="the rollout's sampling temperature "
                   "(default 1.0)")
    g.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    g.add_argument(
        "--repeat", type=int, default=1, help="K seeds from the same initial weights, for calibration"
    )
    g.add_argument(
        "--num-rollout", type=int, default=2, help="rollouts; every one but the last is trained on"
    )
    g.add_argument("--n-prompts", type=int, default=None,
                   help="prompts per rollout (default on GPUs: seed 004's 8; on CPU: 2, or one per data-parallel "
                        "rank when more)")
    g.add_argument("--n-samples", type=int, default=None,
                   help="samples per prompt, the GRPO group (default on GPUs: seed 004's 8; on CPU: 4)")
    g.add_argument("--max-response-len", type=int, default=None,
                   help="response cap in tokens (default on GPUs: seed 004's 100; on CPU: 16, for speed)")
    g.add_argument("--reward", default="target", help="target (dense, for untrained models) | math")
    g.add_argument("--gradient-checkpointing", action="store_true")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=None,
                   help="colocate: keep the train state in host memory while rolling out and the rollout copy "
                        "there while training (default on GPUs: on, unless the run is on one device and fits "
                        "resident in 80%% of it; off on CPU, where it frees nothing)")
    g.add_argument(
        "--checkpoint", type=Path, default=None, help="an HF checkpoint folder (default: prepared and cached)"
    )
    g.add_argument("--prompt-data", type=Path, default=None,
                   help="a JSONL of prompts and labels (default the shipped data/math.jsonl)")
    g.add_argument("--trainer", default="fsdp", choices=("fsdp", "megatron"),
                   help="fsdp: HF modeling code (FSDP2 on several GPUs); megatron: a megatron-core GPTModel "
                        "loaded and synced through the HF <-> Megatron bridge (pip install 'rlsmoke[megatron]')")
    g.add_argument("--launcher-label", default=None,
                   help="the launcher field of the thresholds key (default: builtin; builtin-megatron with "
                        "--trainer megatron)")
    g.add_argument("--records-only", action="store_true",
                   help="write the metrics and summary, gate nothing: the caller gates (the suite does)")  # fmt: skip
    g.add_argument("--out", type=Path, default=None, help="artifacts folder (default: ./rlsmoke-runs/CASE)")
    p.set_defaults(func=handler)


def config_from_args(args):
    """Validate every flag into a RunConfig before anything heavy is imported."""
    platform = get_platform(args.platform or detect().platform)
    tiny = args.tiny if args.tiny is not None else platform.name == "cpu"
    case = case_from_args(args, tiny=tiny)
    topo = plan_topology(case.spec(), platform.name, case.num_gpus, case.mode, dict(case.overrides),
                         gpus_per_node=case.gpus_per_node, target=case.target)  # fmt: skip
    if topo.mode == "async" and (topo.actor_gpus, topo.rollout_gpus) != (1, BUILTIN_ASYNC_GPUS - 1):
        raise RlsmokeError(f"mode=async with {topo.actor_gpus} train + {topo.rollout_gpus} rollout GPUs: the built-in "
                           "engine places one trainer and one rollout engine", rule="engine.placement",
                           fix=f"use --mode async --num-gpus {BUILTIN_ASYNC_GPUS}")  # fmt: skip
    device_class = "CPU"
    if platform.name != "cpu":
        host = detect()
        if host.platform != platform.name or host.count < topo.num_gpus:
            raise RlsmokeError(
                f"num_gpus={topo.num_gpus} on platform={platform.name}, but this host has {host.describe()}",
                rule="engine.gpus",
                fix="ask for at most the visible GPUs, or run --platform cpu",
            )
        device_class = host.device
    rollout_default = default_dtype(platform.name).split("/")[0]
    default_shape = BatchShape.for_platform(platform.name)
    cfg = RunConfig(
        case=case.name, tiny=tiny, platform=platform.name, device=platform.torch_device, device_class=device_class,
        num_gpus=topo.num_gpus, mode=topo.mode, seed=args.seed,
        rollout_dtype=dtype_name(args.rollout_dtype or rollout_default, "--rollout-dtype"),
        train_dtype=dtype_name(args.train_dtype, "--train-dtype"), rollout_temperature=args.rollout_temperature,
        compute_dtype=dtype_name(args.compute_dtype, "--compute-dtype") if args.compute_dtype else None,
        inject=parse_inject(args.inject), num_rollout=args.num_rollout,
        n_prompts=args.n_prompts or default_shape.n_prompts(topo.mode, topo.num_gpus),
        n_samples=args.n_samples or default_shape.n_samples,
        max_response_len=args.max_response_len or default_shape.max_response_len, reward=args.reward,
        compute_path=args.compute_path,
        gradient_checkpointing=args.gradient_checkpointing, offload=args.offload, checkpoint=args.checkpoint,
        launcher=args.launcher_label or ("builtin-megatron" if args.trainer == "megatron" else "builtin"),
        trainer=args.trainer,
        **({"prompt_data": args.prompt_data} if args.prompt_data else {}),
    )  # fmt: skip
    if args.repeat < 1:
        raise RlsmokeError(f"repeat={args.repeat} must be >= 1", rule="run.config", fix="adjust --repeat")
    cfg.validate()
    if platform.name != "cpu":
        from rlsmoke.memory import check_run_fits, offload_needed

        if cfg.offload is None:
            cfg = cfg.replace(offload=offload_needed(cfg, case.spec()))
        check_run_fits(cfg, case.spec())  # a run that cannot fit is refused here, not by an OOM after loading
    return cfg


def writable_out(out: Path) -> Path:
    """--out as a folder this process can write, made now: a bad one is bad input, not a traceback."""
    if out.exists() and not out.is_dir():
        raise RlsmokeError(f"--out {out} is a file, not a folder", rule="run.out",
                           fix="pass --out a new or existing folder (default ./rlsmoke-runs/CASE)")  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".rlsmoke-write-probe"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise RlsmokeError(f"--out {out} cannot be written ({exc.strerror or exc})", rule="run.out",
                           fix="pass --out a folder you can write (default ./rlsmoke-runs/CASE)") from None  # fmt: skip
    return out


def _on_sigterm(signum, frame) -> None:
    # Once: a second SIGTERM during the cleanup must not cut it short (SIGKILL still ends everything).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def gate_run(out: Path) -> tuple[Verdict, SeedVerdicts]:
    """The thresholds' verdict on a finished run folder, written into its summary.json.

    --repeat K: every seed is its own record and is gated; each gate shows its worst seed, and any
    failing seed fails the run.
    """
    records = seed_records(out)
    try:
        gates = lookup_gates(RunKey.from_summary(records[0].meta))
    except RlsmokeError as exc:
        # A new device or dtype has no thresholds yet: keep what calibration needs, then say so.
        values = [{k: rec.value(k) for k in rec.keys()} for rec in records]
        update_summary(out, ({"metrics": values[0]} if len(records) == 1 else {"per_repeat": values})
                       | {"gates": [], "verdict": "FAIL", "error": exc.one_line()})  # fmt: skip
        raise
    first = int(records[0].meta.get("seed", 0))
    seeds = SeedVerdicts(tuple(first + r for r in range(len(records))), tuple(gates.check(rec) for rec in records))
    verdict = seeds.verdicts[0] if len(records) == 1 else seeds.worst()
    fields = verdict.summary_fields()  # --repeat K: each gate's worst seed
    if len(records) > 1:
        for gate_json, (_, seed, failing) in zip(fields["gates"], seeds.per_gate(), strict=True):
            gate_json |= {"seed": seed, "failing_seeds": failing}
        fields["seeds"] = list(seeds.seeds)
        fields["failed_seeds"] = seeds.failed_seeds()
        # each seed's gated values and verdict
        fields["per_repeat"] = [{g.summary_key: rec.value(g.metric, g.reduce) for g in gates} for rec in records]
        fields["per_repeat_verdict"] = ["PASS" if v.passed else "FAIL" for v in seeds.verdicts]
    update_summary(out, fields)
    return verdict, seeds


def handler(args) -> int:
    cfg = config_from_args(args)
    out = writable_out(args.out or Path("rlsmoke-runs") / cfg.case)
    # Set before Ray starts: the async placement keeps it over Ray's own (which aborts with a stack dump).
    signal.signal(signal.SIGTERM, _on_sigterm)
    from rlsmoke.engine.run import execute  # torch and transformers load here, after validation

    try:
        summary = execute(cfg, out, repeat=args.repeat)
    except RunError as exc:
        print(f"error: [{exc.rule}] {exc}. Artifacts: {out}", file=sys.stderr)
        return ExitCode.RUN_FAILED
    print(f"{cfg.case} platform={cfg.platform} device={cfg.device_class} mode={cfg.mode} dtype={cfg.dtype_key} "
          f"seed={cfg.seed} inject={cfg.inject} ({summary['seconds']:.1f} s)")  # fmt: skip
    if args.records_only:
        print(f"records (not gated): {out}")
        return ExitCode.OK
    verdict, seeds = gate_run(out)
    print(verdict.table() if len(seeds.seeds) == 1 else seeds.table())
    if not verdict.passed:
        print(verdict.report(), file=sys.stderr)
    print(f"artifacts: {out}")
    return ExitCode.OK if verdict.passed else ExitCode.GATE_FAILED
