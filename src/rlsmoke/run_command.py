"""`rlsmoke run`: one GRPO step of a case on the built-in engine, then its gates (unless --records-only).
Exit codes: 0 pass, 1 a gate failed, 2 bad input, 3 broke, 130/143 stopped by a signal."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from rlsmoke import artifacts
from rlsmoke.engine import megatron, signals
from rlsmoke.engine.config import RunConfig, Variant
from rlsmoke.engine.timing import Laps
from rlsmoke.errors import ExitCode, Interrupted, RlsmokeError, RunError, crash_line
from rlsmoke.facts import TOKENIZER_MODULE, modeling_module
from rlsmoke.repeats import gate_run
from rlsmoke.resolve import resolve_variants
from rlsmoke.run_flags import add_run_args, add_train_only_args, case_and_session, config_from_args


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="run one GRPO step on the built-in engine and check its gates")
    add_run_args(p)
    add_train_only_args(p)  # --launcher miles --train-only: Miles' trainer on the engine's rollout
    p.set_defaults(func=handler)


class CommandLog(artifacts.RunLog):
    """The command's own run.log lines after the engine's, timed from the process's start."""

    def interrupted(self, exc: KeyboardInterrupt) -> None:
        """Unless the engine said so already: an interrupt before the run began, or after it ended."""
        name = signals.interrupted_by(exc)
        last = self.path.read_text().rstrip().splitlines()[-1:] if self.path.exists() else []
        if not (last and f"] interrupted by {name}" in last[0]):
            self(f"interrupted by {name}")


def _process_started() -> float:
    """When this process began, on the perf_counter clock (Linux: /proc); elsewhere, now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.perf_counter() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter()


def handler(args) -> int:
    if args.launcher == "miles":
        from rlsmoke.processes import train_only

        return train_only.handler(args)
    started = _process_started()
    with signals.stopping_run():  # before anything starts, until the records and the verdict are written
        return _handle(args, started)


def _handle(args, started: float) -> int:
    # what the process spends before the engine's clock starts (its `seconds` does not hold it), by phase
    before = Laps({"start": time.perf_counter() - started})
    if args.variants is None:
        cfgs = [config_from_args(args)]
        outs = [args.out or artifacts.default_out(cfgs[0].case)]
    else:  # each variant validated before anything loads, its own run folder under --out
        cfgs = resolve_variants(*case_and_session(args))
        root = args.out or artifacts.default_out(cfgs[0].case)
        outs = [root / Variant(c.inject, c.rollout_temperature).slug for c in cfgs]
        for out in outs:  # refused before any of them is created or locked
            artifacts.earlier_records(out, overwrite=args.overwrite)
    before("config")
    with contextlib.ExitStack() as held:
        folders = [held.enter_context(artifacts.RunFolder(out, overwrite=args.overwrite)) for out in outs]
        # a folder's records: under --overwrite, staged beside it until the commit
        runs = [(cfg, folder.records) for cfg, folder in zip(cfgs, folders, strict=True)]
        logs = [CommandLog(out / "run.log", started) for _, out in runs]
        try:
            code = _run_and_gate(runs, outs, args, logs, started, before)
            # a stop whose exception a finalizer swallowed: stopped all the same
            if signals.received() is not None:
                raise Interrupted(signals.received())
            if code in (ExitCode.OK, ExitCode.GATE_FAILED):
                for folder in folders:
                    folder.commit()
            return code
        # Ctrl-C or SIGTERM (Interrupted): the engine stopped what it started
        except KeyboardInterrupt as exc:
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
            if artifacts.no_room(exc):  # the disk, not the run: one line, never a traceback or exit 1
                raise artifacts.disk_full(runs[0][1], exc) from None
            # a bug: exit 3, never 1 (a gate failed); the traceback goes to run.log
            for log in logs:
                with contextlib.suppress(OSError):
                    log("error: [run.crashed] the run raised an unexpected exception",
                        block=traceback.format_exc().rstrip())  # fmt: skip
            print(crash_line("run", exc, f"Traceback in {logs[0].path}"), file=sys.stderr)
            return ExitCode.RUN_FAILED


def _load_engine(cfg: RunConfig, log: CommandLog):
    """The engine and its lazy imports, loaded while an interrupt still ends the process at once."""

    def say(signum: int) -> None:
        log.interrupted(Interrupted(signum))
        print(f"error: interrupted by {signal.Signals(signum).name}; nothing had started yet", file=sys.stderr,
              flush=True)  # fmt: skip

    with signals.exit_at_once(say):
        from rlsmoke.engine.run import execute, execute_variants
        from rlsmoke.engine.timing import describe_timing  # torch and transformers

        lazy = [TOKENIZER_MODULE, modeling_module(cfg.spec.hf_model_type)]
        if cfg.trainer == "megatron":
            lazy += megatron.MODULES
        for name in lazy + (["ray", "ray.util.placement_group"] if cfg.mode == "async" else []):
            with contextlib.suppress(ImportError):  # the engine says what is missing, where it needs it
                importlib.import_module(name)
    return describe_timing, execute, execute_variants


def _run_and_gate(runs: list[tuple[RunConfig, Path]], outs: list[Path], args, logs: list[CommandLog],
                  started: float, before: Laps) -> int:  # fmt: skip
    """The run (or each of --variants on one load), then each run's gates; exit 1 if any gate failed.
    `outs` are the folders the records end up in (under --overwrite they are staged beside them)."""
    describe_timing, execute, execute_variants = _load_engine(runs[0][0], logs[0])
    before("engine import")
    try:
        if args.variants is None:
            summaries = [execute(runs[0][0], runs[0][1], repeat=args.repeat, process_s=before.phases)]
        else:
            summaries = execute_variants(runs, process_s=before.phases)
    except RunError as exc:
        print(f"error: [{exc.rule}] {exc}. Artifacts: {runs[0][1] if len(runs) == 1 else runs[0][1].parent}",
              file=sys.stderr)  # fmt: skip
        return ExitCode.RUN_FAILED
    passed = True
    for (cfg, out), final, log, summary in zip(runs, outs, logs, summaries, strict=True):
        shared = " (the load shared with the other variants, counted in the first)" if len(runs) > 1 else ""
        header = (f"{cfg.case} platform={cfg.platform} device={cfg.device_class} mode={cfg.mode} trainer={cfg.trainer} "
                  f"dtype={cfg.dtype_key} seed={cfg.seed} inject={cfg.inject}"
                  + (f" rollout_temperature={cfg.rollout_temperature:g}" if args.variants is not None else "")
                  + f" ({summary['seconds']:.1f} s run{shared}, {time.perf_counter() - started:.1f} s since the "
                  "process began)")  # fmt: skip
        print(header)
        print(f"timing: {describe_timing(summary['timing'])}")
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
        print(f"artifacts: {final}")
        passed = passed and verdict.passed
    return ExitCode.OK if passed else ExitCode.GATE_FAILED
