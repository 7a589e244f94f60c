"""`rlsmoke run`'s flags, resolved into RunConfigs (`rlsmoke.resolve`) before anything heavy is imported."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rlsmoke.cases import Case, add_case_args, add_tiny_arg, case_from_args
from rlsmoke.engine.config import ROLLOUT_BATCHES, ROLLOUT_DECODES, RunConfig, parse_variants
from rlsmoke.facts import (
    DEFAULT_REWARD,
    DEFAULT_TRAINER,
    OFFLOAD_DEFAULT,
    RESIDENT_FRACTION,
    REWARDS,
    TRAINERS,
    faults_text,
)
from rlsmoke.platforms import detect, get_platform
from rlsmoke.recipe import BatchShape
from rlsmoke.resolve import Session, resolve


def add_run_args(p: argparse.ArgumentParser) -> None:
    """`rlsmoke run`'s flags: the case's, then the engine's."""
    add_case_args(p, detect_platform=True)
    g = p.add_argument_group("engine")
    cpu, gpu = BatchShape.for_platform("cpu"), BatchShape.for_platform("nvidia")
    add_tiny_arg(g, "on for --platform cpu, off otherwise")
    g.add_argument("--rollout-dtype", help="float32 | bfloat16 (default: float32 on CPU, bfloat16 on GPU)")
    g.add_argument(
        "--train-dtype", default="float32", help="master weights and optimizer state (default float32)"
    )
    g.add_argument("--inject", metavar="FAULT", help=f"{faults_text()} (bridge-*: with --trainer megatron)")
    g.add_argument(
        "--compute-dtype",
        help="the trainer's forward/backward dtype over the master weights (default: the rollout "
        "dtype on GPUs, as Megatron's bf16 training; the train dtype on CPU)",
    )
    g.add_argument(
        "--compute-path",
        default="params",
        choices=("params", "autocast"),
        help="params: a copy of the weights in the compute dtype over fp32 main parameters, as "
        "Megatron trains (default); autocast: autocast over the fp32 weights",
    )
    g.add_argument(
        "--rollout-temperature",
        type=float,
        default=1.0,
        help="the rollout's sampling temperature (default 1.0)",
    )
    g.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    g.add_argument(
        "--repeat", type=int, default=1, help="K seeds from the same initial weights, for calibration"
    )
    g.add_argument(
        "--variants",
        metavar="V1,V2,...",
        help="several runs of the seed on one load, each from the initial weights and gated as its own "
        "run in --out/SLUG: clean, or an --inject fault, each with @T for its rollout temperature "
        "(default --rollout-temperature), e.g. clean,stale-weights,temperature-mismatch@0.8",
    )
    g.add_argument(
        "--num-rollout", type=int, default=2, help="rollouts; every one but the last is trained on"
    )
    for flag, what, field, on_cpu in (  # the batch's shape: seed 004's on GPUs, a smaller one on CPU
        ("--n-prompts", "prompts per rollout", "prompts", ", or one per data-parallel rank when more"),
        ("--n-samples", "samples per prompt, the GRPO group", "n_samples", ""),
        ("--max-response-len", "response cap in tokens", "max_response_len", ", for speed"),
    ):
        default = f"default on GPUs: seed 004's {getattr(gpu, field)}; on CPU: {getattr(cpu, field)}{on_cpu}"
        g.add_argument(flag, type=int, help=f"{what} ({default})")
    g.add_argument(
        "--rollout-batch",
        default="auto",
        choices=ROLLOUT_BATCHES,
        help="generate calls: rank, a rank's groups in one call, left-padded; group, one call per group; "
        "length, one per prompt length (default auto: rank on GPUs, group on CPU; length for a "
        "model with KDA layers, which left padding would pass through)",
    )
    g.add_argument("--rollout-decode", default=Session.rollout_decode, choices=ROLLOUT_DECODES,
                   help="static: a static KV cache, the decode step captured as CUDA graphs on a GPU before the "
                   "first rollout; a model that cannot falls back to generate, named in the summary; generate: "
                   "transformers' own; auto: static on NVIDIA GPUs unless the run's thresholds were calibrated "
                   f"from generate, generate on CPU and ROCm (default: {Session.rollout_decode})")  # fmt: skip
    g.add_argument(
        "--reward",
        default=DEFAULT_REWARD,
        choices=REWARDS,
        help=f"target: dense, for untrained models; deepscaler: Miles' 0/1 math reward (default "
        f"{DEFAULT_REWARD})",
    )
    g.add_argument("--gradient-checkpointing", action="store_true")
    g.add_argument(
        "--offload",
        action=argparse.BooleanOptionalAction,
        help="colocate: keep the train state in host memory while rolling out and the rollout copy "
        f"there while training (default: {OFFLOAD_DEFAULT})".replace("%", "%%"),
    )
    g.add_argument(
        "--offload-train",
        action=argparse.BooleanOptionalAction,
        help="with the offload on, the train state leaves the device during the rollout too (default: "
        "on with --offload; otherwise on unless the rollout fits beside the resident train state "
        f"in {RESIDENT_FRACTION:.0%}% of the device, so only the rollout copy moves)",
    )
    g.add_argument("--checkpoint", type=Path, help="an HF checkpoint folder (default: prepared and cached)")
    g.add_argument(
        "--prompt-data", type=Path, help="a JSONL of prompts and labels (default the shipped data/math.jsonl)"
    )
    g.add_argument(
        "--trainer",
        default=DEFAULT_TRAINER,
        choices=TRAINERS,
        help="fsdp: HF modeling code (FSDP2 on several GPUs); megatron: a megatron-core GPTModel "
        "loaded and synced through the HF <-> Megatron bridge (pip install 'rlsmoke[megatron]'; "
        f"default {DEFAULT_TRAINER})",
    )
    g.add_argument(
        "--launcher-label",
        help="the launcher field of the thresholds key (default: builtin; builtin-megatron with "
        "--trainer megatron)",
    )
    g.add_argument("--records-only", action="store_true",
                   help="write the metrics and summary, gate nothing: the caller gates (the suite does)")  # fmt: skip
    g.add_argument(
        "--out",
        type=Path,
        help="artifacts folder; one that holds an earlier run's records is refused unless --overwrite "
        "(default: a new ./rlsmoke-runs/CASE/YYYYmmdd-HHMMSS)",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the records (run.log, metrics.jsonl, summary.json) of an earlier run in --out",
    )


# Session fields no same-named `rlsmoke run` flag sets; the rest are read off the flags by name.
NOT_FLAGS = frozenset({"host", "launcher", "gated", "variants"})


def case_and_session(args) -> tuple[Case, Session]:
    """The flags as the case they name (on the given platform, else the detected one) and the session."""
    platform = get_platform(args.platform or detect().platform)
    tiny = args.tiny if args.tiny is not None else platform.name == "cpu"
    case = dataclasses.replace(case_from_args(args, tiny=tiny), platform=platform.name)
    variants = (
        tuple(parse_variants(args.variants, args.rollout_temperature)) if args.variants is not None else ()
    )
    same = {f.name: getattr(args, f.name) for f in dataclasses.fields(Session) if f.name not in NOT_FLAGS}
    session = Session(**same, launcher=args.launcher_label, gated=not args.records_only, variants=variants)
    return case, session


def config_from_args(args) -> RunConfig:
    """The one run the flags ask for, validated."""
    return resolve(*case_and_session(args))


def add_train_only_args(p: argparse.ArgumentParser) -> None:
    """`rlsmoke run`'s flags for Miles' train-only step."""
    g = p.add_argument_group("Miles (train-only)")
    g.add_argument(
        "--launcher",
        choices=("builtin", "miles"),
        default="builtin",
        help="builtin: the built-in engine; miles: Miles' own train.py (with --train-only)",
    )
    g.add_argument("--train-only", action="store_true", help="with --launcher miles: the built-in engine rolls out, "
                   "Miles trains one step on its rollout file (--debug-train-only), no SGLang")  # fmt: skip
    g.add_argument("--miles-root", type=Path, help="a Miles checkout (train.py in it)")
    g.add_argument("--megatron-root", help="Miles' Megatron-LM checkout (default /root/Megatron-LM)")
    g.add_argument("--model-dir", type=Path, help="where <case> and <case>_torch_dist live "
                   "(default: rlsmoke's cache, miles-models/)")  # fmt: skip
