"""`rlsmoke run`: one GRPO step of a case on the built-in engine, then its gates (evaluated here, once;
with --records-only the caller gates).

Exit codes: 0 every gate passed, 1 a gate failed, 2 bad input (incl. a missing checkpoint and OOM),
3 the run broke (NaN, a crashed worker, any unexpected exception: its traceback goes to run.log),
143 stopped by SIGTERM (130 by Ctrl-C): the workers and the Ray cluster the run started are stopped
and run.log ends with "interrupted".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from rlsmoke.artifacts import RunFolder, disk_full, earlier_records, no_room
from rlsmoke.cases import add_case_args, add_tiny_arg, case_from_args
from rlsmoke.engine import limits, signals
from rlsmoke.engine.config import (
    BUILTIN_ASYNC_GPUS,
    BUILTIN_METRICS,
    ROLLOUT_BATCHES,
    RunConfig,
    Variant,
    dtype_name,
    parse_inject,
    parse_variants,
)
from rlsmoke.engine.data import prompt_rows
from rlsmoke.errors import ExitCode, Interrupted, RlsmokeError, RunError
from rlsmoke.facts import (
    DEFAULT_REWARD,
    DEFAULT_TRAINER,
    OFFLOAD_DEFAULT,
    RESIDENT_FRACTION,
    REWARDS,
    TRAINERS,
    faults_text,
)
from rlsmoke.metrics import seed_records, update_summary
from rlsmoke.platforms import detect, get_platform
from rlsmoke.recipe import BatchShape
from rlsmoke.repeats import SeedVerdicts
from rlsmoke.runkey import RunKey, default_dtype
from rlsmoke.thresholds import Verdict, check_thresholds, lookup_gates
from rlsmoke.topology import plan_topology


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run one GRPO step on the built-in engine and check its gates")
    add_case_args(p, detect_platform=True)
    g = p.add_argument_group("engine")
    cpu, gpu = BatchShape.for_platform("cpu"), BatchShape.for_platform("nvidia")
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
        help=f"{faults_text()} (bridge-*: with --trainer megatron)",
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
    g.add_argument("--variants", default=None, metavar="V1,V2,...",
                   help="several runs of the seed on one load, each from the initial weights and gated as its own "
                        "run in --out/SLUG: clean, or an --inject fault, each with @T for its rollout temperature "
                        "(default --rollout-temperature), e.g. clean,stale-weights,temperature-mismatch@0.8")
    g.add_argument(
        "--num-rollout", type=int, default=2, help="rollouts; every one but the last is trained on"
    )
    g.add_argument("--n-prompts", type=int, default=None,
                   help=f"prompts per rollout (default on GPUs: seed 004's {gpu.prompts}; on CPU: {cpu.prompts}, or "
                        "one per data-parallel rank when more)")
    g.add_argument("--n-samples", type=int, default=None,
                   help=f"samples per prompt, the GRPO group (default on GPUs: seed 004's {gpu.n_samples}; on CPU: "
                        f"{cpu.n_samples})")
    g.add_argument("--max-response-len", type=int, default=None,
                   help=f"response cap in tokens (default on GPUs: seed 004's {gpu.max_response_len}; on CPU: "
                        f"{cpu.max_response_len}, for speed)")
    g.add_argument("--rollout-batch", default="auto", choices=ROLLOUT_BATCHES,
                   help="generate calls: rank, a rank's groups in one call, left-padded; group, one call per group; "
                        "length, one per prompt length (default auto: rank on GPUs, group on CPU; length for a "
                        "model with KDA layers, which left padding would pass through)")
    g.add_argument("--reward", default=DEFAULT_REWARD, choices=REWARDS,
                   help=f"target: dense, for untrained models; deepscaler: Miles' 0/1 math reward (default "
                        f"{DEFAULT_REWARD})")
    g.add_argument("--gradient-checkpointing", action="store_true")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=None,
                   help="colocate: keep the train state in host memory while rolling out and the rollout copy "
                        f"there while training (default: {OFFLOAD_DEFAULT})".replace("%", "%%"))
    g.add_argument("--offload-train", action=argparse.BooleanOptionalAction, default=None,
                   help="with the offload on, the train state leaves the device during the rollout too (default: "
                        "on with --offload; otherwise on unless the rollout fits beside the resident train state "
                        f"in {RESIDENT_FRACTION:.0%}% of the device, so only the rollout copy moves)")
    g.add_argument(
        "--checkpoint", type=Path, default=None, help="an HF checkpoint folder (default: prepared and cached)"
    )
    g.add_argument("--prompt-data", type=Path, default=None,
                   help="a JSONL of prompts and labels (default the shipped data/math.jsonl)")
    g.add_argument("--trainer", default=DEFAULT_TRAINER, choices=TRAINERS,
                   help="fsdp: HF modeling code (FSDP2 on several GPUs); megatron: a megatron-core GPTModel "
                        "loaded and synced through the HF <-> Megatron bridge (pip install 'rlsmoke[megatron]'; "
                        f"default {DEFAULT_TRAINER})")
    g.add_argument("--launcher-label", default=None,
                   help="the launcher field of the thresholds key (default: builtin; builtin-megatron with "
                        "--trainer megatron)")
    g.add_argument("--records-only", action="store_true",
                   help="write the metrics and summary, gate nothing: the caller gates (the suite does)")  # fmt: skip
    g.add_argument("--out", type=Path, default=None,
                   help="artifacts folder; one that holds an earlier run's records is refused unless --overwrite "
                        "(default: a new ./rlsmoke-runs/CASE/YYYYmmdd-HHMMSS)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the records (run.log, metrics.jsonl, summary.json) of an earlier run in --out")
    p.set_defaults(func=handler)


def config_from_args(args):
    """Validate every flag into a RunConfig before anything heavy is imported."""
    platform = get_platform(args.platform or detect().platform)
    tiny = args.tiny if args.tiny is not None else platform.name == "cpu"
    case = case_from_args(args, tiny=tiny)
    spec = case.spec()  # resolved once here; the config carries its own (RunConfig.spec)
    topo = plan_topology(spec, platform.name, case.num_gpus, case.mode, dict(case.overrides),
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
        # a flag given as 0 is refused by validate(), never replaced by the default
        n_prompts=_given(args.n_prompts, default_shape.n_prompts(topo.mode, topo.num_gpus)),
        n_samples=_given(args.n_samples, default_shape.n_samples),
        max_response_len=_given(args.max_response_len, default_shape.max_response_len), reward=args.reward,
        compute_path=args.compute_path,
        gradient_checkpointing=args.gradient_checkpointing, offload=args.offload, checkpoint=args.checkpoint,
        offload_train=args.offload_train,
        launcher=args.launcher_label or ("builtin-megatron" if args.trainer == "megatron" else "builtin"),
        trainer=args.trainer, rollout_batch=args.rollout_batch,
        **({"prompt_data": args.prompt_data} if args.prompt_data else {}),
    )  # fmt: skip
    if args.repeat < 1:
        raise RlsmokeError(f"repeat={args.repeat} must be >= 1", rule="run.config", fix="adjust --repeat")
    cfg.validate()
    limits.check_numbers(cfg, repeat=args.repeat)
    prompt_rows(cfg.prompt_data, cfg.n_prompts)  # read again by the run: a bad file is refused here, not there
    longest = limits.longest_prompt(cfg.prompt_data, cfg.checkpoint)
    limits.check_context(cfg, longest, limits.context_limits(spec, cfg.checkpoint))
    if platform.name == "cpu":
        limits.check_host_memory(cfg, longest.tokens)
    if not args.records_only:  # gated here after the run: a broken thresholds file is refused before it
        check_thresholds(cfg.run_key, BUILTIN_METRICS)
    if platform.name != "cpu":
        from rlsmoke.memory import check_run_fits, initial_on_device, offload_needed, offload_train_needed

        if cfg.offload is None:
            cfg = cfg.replace(offload=offload_needed(cfg, spec))
            if cfg.offload and cfg.offload_train is None:
                cfg = cfg.replace(offload_train=offload_train_needed(cfg, spec))
        if args.repeat > 1 or args.variants:  # each further run starts from weights kept after the load
            cfg = cfg.replace(initial_on_device=initial_on_device(cfg, spec))
        check_run_fits(cfg, spec, prompt_tokens=longest.tokens)  # refused here, not by an OOM after loading
    if cfg.offload_train is not None and not cfg.offload_active:  # it would be ignored
        flag = "--offload-train" if cfg.offload_train else "--no-offload-train"
        raise RlsmokeError(f"{flag} with the colocate offload off for this run (mode={cfg.mode}, "
                           f"platform={cfg.platform})", rule="run.offload_train",
                           fix=f"add --offload (colocate), or drop {flag}")  # fmt: skip
    return cfg


def variants_from_args(args) -> list[RunConfig]:
    """--variants: each variant's config, validated as a run with its --inject and --rollout-temperature
    would be, before anything loads."""
    fix = "drop --inject: a fault goes into --variants (clean,stale-weights,...)"
    if args.inject:
        raise RlsmokeError(f"--inject {args.inject} with --variants", rule="run.variants", fix=fix)
    if args.repeat != 1:
        raise RlsmokeError(f"--repeat {args.repeat} with --variants: both restore the initial weights between runs, "
                           "each for its own", rule="run.variants_repeat",
                           fix="run the variants at one seed, or the repeat without --variants")  # fmt: skip
    variants = parse_variants(args.variants, args.rollout_temperature)
    base = config_from_args(args)
    if base.mode == "async":
        raise RlsmokeError("--variants with mode=async: each Ray actor holds its side's fault in its own process",
                           rule="run.variants_async",
                           fix="run the variants colocated (--mode colocate), or one `rlsmoke run --inject` each")  # fmt: skip
    cfgs = []
    for variant in variants:
        cfg = base.replace(inject=variant.inject, rollout_temperature=variant.rollout_temperature)
        try:
            cfg.validate()
            limits.check_numbers(cfg, repeat=1)
        except RlsmokeError as exc:
            raise RlsmokeError(f"variant {variant}: {exc}", rule=exc.rule,
                               fix=exc.fix or "change that variant in --variants (FAULT@T sets its rollout "
                                              "temperature, e.g. temperature-mismatch@0.8)") from None  # fmt: skip
        cfgs.append(cfg)
    return cfgs


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def default_out(case: str, runs: Path = Path("rlsmoke-runs")) -> Path:
    """A new folder per run, so that no run replaces an earlier one: rlsmoke-runs/CASE/YYYYmmdd-HHMMSS."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out, n = runs / case / stamp, 1
    while out.exists():
        n += 1
        out = runs / case / f"{stamp}-{n}"
    return out


class CommandLog:
    """What the command itself adds to the run's run.log, after the engine closed it: the interrupt or
    crash that cut the run short, and the gates. Lines are timed from the process's start."""

    def __init__(self, out: Path, started: float):
        self.path, self.started = out / "run.log", started

    def __call__(self, text: str, *, block: str = "") -> None:
        with self.path.open("a") as f:
            f.write(f"[{time.perf_counter() - self.started:7.2f}s] {text}\n" + (block + "\n" if block else ""))

    def interrupted(self, exc: KeyboardInterrupt) -> None:
        """Unless the engine said so already: an interrupt before the run began, or after it ended."""
        name = signals.interrupted_by(exc)
        last = self.path.read_text().rstrip().splitlines()[-1:] if self.path.exists() else []
        if not (last and f"] interrupted by {name}" in last[0]):
            self(f"interrupted by {name}")


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


def _process_started() -> float:
    """When this process began, on the perf_counter clock (Linux: from /proc, so the interpreter's start
    counts as `time` counts it); elsewhere, now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.perf_counter() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter()


class ProcessClock:
    """The process's seconds before the engine's own clock starts, by phase: `start` (the interpreter and
    rlsmoke's import, from the process's start), `config` (the flags checked into RunConfigs), `engine
    import` (torch, transformers, the case's modeling code). On a GPU host these cost more than a seed's
    phases did once loads were cut, and a run's `seconds` does not hold them."""

    def __init__(self, started: float):
        self.last = time.perf_counter()
        self.seconds = {"start": round(self.last - started, 3)}

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = round(now - self.last, 3)
        self.last = now


def handler(args) -> int:
    started = _process_started()
    with signals.stopping_run():  # before anything starts, until the records and the verdict are written
        return _handle(args, started)


def _handle(args, started: float) -> int:
    before = ProcessClock(started)  # what the process spends before the engine runs: its own phases in timing
    if args.variants is None:
        cfgs = [config_from_args(args)]
        outs = [args.out or default_out(cfgs[0].case)]
    else:  # each variant its own run folder under --out
        cfgs = variants_from_args(args)
        root = args.out or default_out(cfgs[0].case)
        outs = [root / Variant(c.inject, c.rollout_temperature).slug for c in cfgs]
        for out in outs:  # refused before any of them is created or locked
            earlier_records(out, overwrite=args.overwrite)
    before.lap("config")
    with contextlib.ExitStack() as held:
        folders = [held.enter_context(RunFolder(out, overwrite=args.overwrite)) for out in outs]
        runs = [(cfg, folder.records) for cfg, folder in zip(cfgs, folders, strict=True)]  # --overwrite: staging
        logs = [CommandLog(out, started) for _, out in runs]
        try:
            code = _run_and_gate(runs, args, logs, started, before)
            if signals.received() is not None:  # a stop whose exception a finalizer swallowed: stopped all the same
                raise Interrupted(signals.received())
            if code in (ExitCode.OK, ExitCode.GATE_FAILED):
                for folder in folders:
                    folder.commit()
            return code
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (Interrupted): the engine stopped what it started
            if signals.received() is not None and getattr(exc, "signum", None) != signals.received():
                exc = Interrupted(signals.received())
            for log, folder in zip(logs, folders, strict=True):
                with contextlib.suppress(OSError):
                    log.interrupted(exc)
                folder.discard()
            raise exc from None
        except RlsmokeError as exc:  # the cause stays with the artifacts, not only on the terminal
            for log in logs:
                with contextlib.suppress(OSError):
                    if log.path.exists() and exc.one_line() not in log.path.read_text():
                        log(f"error: {exc.one_line()}")
            raise
        except Exception as exc:
            if no_room(exc):  # the disk, not the run: one line, never a traceback or exit 1
                raise disk_full(runs[0][1], exc) from None
            # a bug: exit 3, never 1 (a gate failed); the traceback goes to run.log
            for log in logs:
                with contextlib.suppress(OSError):
                    log("error: [run.crashed] the run raised an unexpected exception",
                        block=traceback.format_exc().rstrip())  # fmt: skip
            cause = "".join(traceback.format_exception_only(exc)).strip().splitlines()[-1]
            print(f"error: [run.crashed] {cause}. Traceback in {logs[0].path}", file=sys.stderr)
            return ExitCode.RUN_FAILED


def _load_engine(cfg: RunConfig, log: CommandLog):
    """The engine, after validation, and what it would import lazily (the case's modeling code, the
    tokenizers, Ray). Nothing has started yet, so an interrupt meanwhile ends the process at once
    rather than in the middle of an import (which would leave half a module behind)."""

    def say(signum: int) -> None:
        log.interrupted(Interrupted(signum))
        print(f"error: interrupted by {signal.Signals(signum).name}; nothing had started yet", file=sys.stderr,
              flush=True)  # fmt: skip

    with signals.exit_at_once(say):
        from rlsmoke.engine.run import describe_timing, execute, execute_variants  # torch and transformers

        kind = cfg.spec.hf_model_type
        lazy = ["transformers.models.auto.tokenization_auto", f"transformers.models.{kind}.modeling_{kind}"]
        for name in lazy + (["ray", "ray.util.placement_group"] if cfg.mode == "async" else []):
            with contextlib.suppress(ImportError):  # the engine says what is missing, where it needs it
                importlib.import_module(name)
    return describe_timing, execute, execute_variants


def _run_and_gate(runs: list[tuple[RunConfig, Path]], args, logs: list[CommandLog], started: float,
                  before: ProcessClock) -> int:  # fmt: skip
    """The run (or each of --variants on one load), then each run's gates; exit 1 if any gate failed."""
    describe_timing, execute, execute_variants = _load_engine(runs[0][0], logs[0])
    before.lap("engine import")
    try:
        if args.variants is None:
            summaries = [execute(runs[0][0], runs[0][1], repeat=args.repeat, process_s=before.seconds)]
        else:
            summaries = execute_variants(runs, process_s=before.seconds)
    except RunError as exc:
        print(f"error: [{exc.rule}] {exc}. Artifacts: {runs[0][1] if len(runs) == 1 else runs[0][1].parent}",
              file=sys.stderr)  # fmt: skip
        return ExitCode.RUN_FAILED
    passed = True
    for (cfg, out), log, summary in zip(runs, logs, summaries, strict=True):
        shared = " (the load shared with the other variants, counted in the first)" if len(runs) > 1 else ""
        header = (f"{cfg.case} platform={cfg.platform} device={cfg.device_class} mode={cfg.mode} trainer={cfg.trainer} "
                  f"dtype={cfg.dtype_key} seed={cfg.seed} inject={cfg.inject}"
                  + (f" rollout_temperature={cfg.rollout_temperature:g}" if args.variants is not None else "")
                  + f" ({summary['seconds']:.1f} s run{shared}, {time.perf_counter() - started:.1f} s since the "
                  "process began)")  # fmt: skip
        timing = f"timing: {describe_timing(summary['timing'])}"
        print(header)
        print(timing)
        if args.records_only:
            print(f"records (not gated): {out}")
            log(f"{header}; records only, not gated")
            continue
        verdict, seeds = gate_run(out)
        table = verdict.table() if len(seeds.seeds) == 1 else seeds.table()
        print(table)
        log(f"{header}; gates of {verdict.source}:", block=table)
        if not verdict.passed:
            print(verdict.report(), file=sys.stderr)
        print(f"artifacts: {out}")
        passed = passed and verdict.passed
    return ExitCode.OK if passed else ExitCode.GATE_FAILED
