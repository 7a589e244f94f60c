"""`rlsmoke run`: one GRPO step of a case on the built-in engine, then its gates.

Exit codes: 0 every gate passed, 1 a gate failed, 2 bad input (incl. a missing checkpoint and OOM),
3 the run broke (NaN, a crashed worker).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlsmoke.errors import ExitCode, RlsmokeError, RunError


def register(subparsers) -> None:
    from rlsmoke.cli import add_case_args

    p = subparsers.add_parser("run", help="run one GRPO step on the built-in engine and check its gates")
    add_case_args(p, default_platform="cpu")
    g = p.add_argument_group("engine")
    g.add_argument(
        "--tiny",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the tiny width of the case (default: on for --platform cpu, off otherwise)",
    )
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
        help="temperature-mismatch | stale-weights | rollout-noise=SIGMA | train-dropout=P",
    )
    g.add_argument("--compute-dtype", default=None,
                   help="the trainer's forward/backward dtype over the master weights (default: the rollout "
                        "dtype on GPUs, as Megatron's bf16 training; the train dtype on CPU)")
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--repeat", type=int, default=1, help="K seeds from the same initial weights, for calibration"
    )
    g.add_argument(
        "--num-rollout", type=int, default=2, help="rollouts; every one but the last is trained on"
    )
    g.add_argument("--n-prompts", type=int, default=None,
                   help="prompts per rollout (default: 2, or one per data-parallel rank when more)")
    g.add_argument("--n-samples", type=int, default=4, help="samples per prompt (the GRPO group)")
    g.add_argument("--max-response-len", type=int, default=16, help="16 keeps tiny GLM-5 within index_topk")
    g.add_argument("--reward", default="target", help="target (dense, for untrained models) | math")
    g.add_argument("--gradient-checkpointing", action="store_true")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=None,
                   help="colocate: keep the train state in pinned host memory while rolling out and the rollout "
                        "copy there while training (default: on for GPUs, off on CPU where it moves nothing)")
    g.add_argument(
        "--checkpoint", type=Path, default=None, help="an HF checkpoint folder (default: prepared and cached)"
    )
    g.add_argument("--prompt-data", type=Path, default=None)
    g.add_argument("--launcher-label", default="builtin", help="the launcher field of the thresholds key")
    g.add_argument("--out", type=Path, default=None, help="artifacts folder (default: ./rlsmoke-runs/CASE)")
    p.set_defaults(func=handler)


def config_from_args(args):
    """Validate every flag into a RunConfig before anything heavy is imported."""
    from rlsmoke.cli import case_from_args
    from rlsmoke.engine.config import RunConfig, dtype_name, parse_inject
    from rlsmoke.platforms import detect, get_platform

    platform = get_platform(args.platform)
    tiny = args.tiny if args.tiny is not None else platform.name == "cpu"
    case = case_from_args(args, tiny=tiny)
    from rlsmoke.topology import plan_topology

    topo = plan_topology(case.spec(), platform.name, case.num_gpus, case.mode, dict(case.overrides),
                         gpus_per_node=case.gpus_per_node, target=case.target)  # fmt: skip
    if topo.mode == "async" and (topo.actor_gpus, topo.rollout_gpus) != (1, 1):
        raise RlsmokeError(f"mode=async with {topo.actor_gpus} train + {topo.rollout_gpus} rollout GPUs: the built-in "
                           "engine places one trainer and one rollout engine", rule="engine.placement",
                           fix="use --mode async --num-gpus 2")  # fmt: skip
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
    rollout_default = "float32" if platform.name == "cpu" else "bfloat16"
    cfg = RunConfig(
        case=case.name, tiny=tiny, platform=platform.name, device=platform.torch_device, device_class=device_class,
        num_gpus=topo.num_gpus, mode=topo.mode, seed=args.seed,
        rollout_dtype=dtype_name(args.rollout_dtype or rollout_default, "--rollout-dtype"),
        train_dtype=dtype_name(args.train_dtype, "--train-dtype"), rollout_temperature=args.rollout_temperature,
        compute_dtype=dtype_name(args.compute_dtype, "--compute-dtype") if args.compute_dtype else None,
        inject=parse_inject(args.inject), num_rollout=args.num_rollout,
        n_prompts=args.n_prompts or (max(2, topo.num_gpus) if topo.mode == "colocate" else 2),
        n_samples=args.n_samples, max_response_len=args.max_response_len, reward=args.reward,
        gradient_checkpointing=args.gradient_checkpointing, offload=args.offload, checkpoint=args.checkpoint, launcher=args.launcher_label,
        **({"prompt_data": args.prompt_data} if args.prompt_data else {}),
    )  # fmt: skip
    if args.repeat < 1:
        raise RlsmokeError(f"repeat={args.repeat} must be >= 1", rule="run.config", fix="adjust --repeat")
    cfg.validate()
    if platform.name != "cpu":
        from rlsmoke.memory import check_run_fits

        check_run_fits(cfg, case.spec())  # a run that cannot fit is refused here, not by an OOM after loading
    return cfg


def handler(args) -> int:
    cfg = config_from_args(args)
    out = args.out or Path("rlsmoke-runs") / cfg.case
    from rlsmoke.engine.run import execute  # torch and transformers load here, after validation

    try:
        summary = execute(cfg, out, repeat=args.repeat)
    except RunError as exc:
        print(f"error: [{exc.rule}] {exc}. Artifacts: {out}", file=sys.stderr)
        return ExitCode.RUN_FAILED
    verdict = summary["_verdict"]
    print(f"{cfg.case} platform={cfg.platform} device={cfg.device_class} mode={cfg.mode} dtype={cfg.dtype_key} "
          f"seed={cfg.seed} inject={cfg.inject} ({summary['seconds']:.1f} s)")  # fmt: skip
    print(verdict.table())
    if not verdict.passed:
        print(verdict.report(), file=sys.stderr)
    print(f"artifacts: {out}")
    return ExitCode.OK if verdict.passed else ExitCode.GATE_FAILED
