"""The `rlsmoke` command. `cases` and `plan` import no torch; the other subcommands load when asked for."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import threading
from pathlib import Path

from rlsmoke.cases import add_case_args, case_from_args
from rlsmoke.errors import ExitCode, RlsmokeError, crash_line, require_known
from rlsmoke.facts import DEFAULT_REWARD, REWARDS, VERSION
from rlsmoke.platforms import PLATFORMS
from rlsmoke.targets import TARGETS

# Subcommands registered by other packages: name -> module with `register(subparsers)`.
EXTERNAL = {
    "prepare": "rlsmoke.checkpoints.cli",
    "verify": "rlsmoke.checkpoints.cli",
    "run": "rlsmoke.run_command",
    "report": "rlsmoke.report",
    "calibrate": "rlsmoke.calibration",
}


class _Parser(argparse.ArgumentParser):
    """Usage errors are one `error:` line and exit 2, like every other bad input."""

    def error(self, message: str):  # noqa: D401
        sys.stderr.write(f"error: [usage] {message}. Fix: see `{self.prog} --help`.\n")
        sys.exit(ExitCode.USAGE)


def cmd_cases(args) -> int:
    """One line a case: the model, its layers and experts, its width (and the tiny one), its size."""
    from rlsmoke.models import MODEL_NAMES, model_spec

    for name in MODEL_NAMES:
        spec, tiny = model_spec(name), model_spec(name, tiny=True)
        dense = f"{spec.first_k_dense} dense + {spec.num_layers - spec.first_k_dense} MoE"
        print(f"{name:<27} {spec.family} ({spec.hf_model_type}), {spec.num_layers} layers ({dense}), "
              f"{spec.num_experts} experts top-{spec.moe_topk}, width {spec.hidden_size} "
              f"(--tiny {tiny.hidden_size}), {spec.parameter_count() / 1e9:.1f} B params")  # fmt: skip
    return ExitCode.OK


def shell_script(plan, steps) -> str:
    """The flow as a shell-safe script run from the Miles checkout. Across nodes every node runs it:
    NODE_RANK 0 starts Ray's head and the job, the others join and stay up."""
    launch, nodes = plan.launch, plan.launch.num_nodes
    by_name = {s.name: s for s in steps}
    lines = ["#!/usr/bin/env bash", f"# rlsmoke plan {plan.case.name} --platform {plan.topology.platform} "
             f"--num-gpus {plan.topology.num_gpus} --mode {plan.topology.mode}"]  # fmt: skip
    if nodes > 1:
        lines.append(f"# {nodes} nodes of {plan.topology.gpus_per_node} GPUs, head {launch.master_addr}: run this on "
                     f"every node with NODE_RANK=0 on the head, 1..{nodes - 1} on the others")  # fmt: skip
    lines.append("set -euo pipefail")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
    lines.append("# ray-head: Ray's head (across nodes the others join it and stay there)")
    if nodes > 1:
        ask = f"set NODE_RANK: 0 on the head ({launch.master_addr}), 1..{nodes - 1} on the other nodes"
        lines += [f"case \"${{NODE_RANK:?{ask}}}\" in", f"  0) {shlex.join(launch.ray_start())} ;;",
                  f"  *) exec {shlex.join(launch.ray_join())} ;;", "esac"]  # fmt: skip
    else:
        lines.append(shlex.join(launch.ray_start()))
    for step in (by_name["prepare"], by_name["convert"]):  # on the head only, before its job
        lines += [f"# {step.name}: {step.what}, unless done", f"{step.skip_when} || {step.shell()}"]
    lines.append("# submit: the job (`--format json` has its `ray job submit` form)")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in by_name["submit"].env.items()]
    return "\n".join(lines + plan.launch.script_lines())


def cmd_plan(args) -> int:
    if args.train_only:  # Miles' trainer alone on the built-in engine's rollout file
        from rlsmoke.launch.train_only import plan_handler

        return plan_handler(args)
    from rlsmoke.launch import flow
    from rlsmoke.launch.miles import Paths
    from rlsmoke.recipe import Recipe

    case = case_from_args(args)
    plan = case.plan(validate=not args.no_validate, recipe=Recipe(reward=args.reward))
    if args.diff:
        from rlsmoke.launch.diff import diff

        require_known("--diff", args.diff, (*PLATFORMS, *TARGETS), rule="plan.diff")  # a platform or a target
        print(diff(case, args.diff))
        return ExitCode.OK
    if head := _head_addr(args, plan.topology):  # the same topology, its launch naming the head
        plan = case.plan(validate=not args.no_validate, recipe=Recipe(reward=args.reward, master_addr=head))
    # the user's Miles parses this argv first: `error: [miles.flags] ...`, exit 2, no plan
    if args.check_miles:
        from rlsmoke.processes.preflight import check_flags

        check_flags(plan.launch, args.check_miles)
        print(f"miles: {args.check_miles} accepts every flag of target {plan.launch.target}", file=sys.stderr)
    steps = flow.steps(plan, Paths())
    if args.format == "json":
        print(json.dumps(plan.to_json() | {"steps": [s.to_json() for s in steps]}, indent=2))
    else:
        print(shell_script(plan, steps))
    if not args.check:
        return ExitCode.OK
    # the real parsers' verdicts; only those of the plan's own target decide (the other dialect must fail)
    from rlsmoke.conformance import check_plan, format_verdicts, real_verdict

    verdicts = check_plan(plan.to_json())
    print(format_verdicts(verdicts), file=sys.stderr)
    return ExitCode.GATE_FAILED if real_verdict(verdicts) is False else ExitCode.OK


def _head_addr(args, topo) -> str | None:
    """--head-addr, else MASTER_ADDR on a plan across nodes; a multi-node plan refuses loopback or none."""
    from rlsmoke.launch.miles import is_loopback

    head = args.head_addr or (os.environ.get("MASTER_ADDR") if topo.num_nodes > 1 else None)
    if topo.num_nodes > 1 and (not head or is_loopback(head)):
        got = f"head address {head}" if head else "no head address"
        raise RlsmokeError(
            f"num_gpus={topo.num_gpus} spans {topo.num_nodes} nodes of {topo.gpus_per_node} GPUs but the plan has {got}; "
            "the other nodes reach the head (MASTER_ADDR, Ray's head) by an address they can route to",
            rule="plan.head_addr",
            fix="pass --head-addr with the head node's IP, or set MASTER_ADDR",
        )
    return head


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="rlsmoke", description="One-step end-to-end tests for GRPO on large MoE models.")
    parser.add_argument("--version", action="version", version=f"rlsmoke {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("cases", help="list the cases, one line each: model, layers, experts, width")
    p.set_defaults(func=cmd_cases)

    p = sub.add_parser("plan", help="validate a case's topology and render its Miles launch")
    add_case_args(p)
    p.add_argument(
        "--format", choices=("shell", "json"), default="shell", help="the launch as (default shell)"
    )
    p.add_argument(
        "--diff",
        metavar="PLATFORM|TARGET",
        help="print the flags and env that differ on another platform, or for another target",
    )
    p.add_argument(
        "--check-miles",
        metavar="DIR",
        type=Path,
        help="parse the launch with the Miles checkout at DIR (its own parser, this Python)",
    )
    p.add_argument("--check", action="store_true", help="also run the real Miles/SGLang/Megatron validators")
    p.add_argument("--no-validate", action="store_true", help="render even if a topology rule fails")
    p.add_argument("--reward", choices=REWARDS, default=DEFAULT_REWARD,
                   help="the job's reward: rlsmoke's dense target reward through --custom-rm-path (default), or "
                   "Miles' 0/1 deepscaler reward (grad_norm can then only be gated finite)")  # fmt: skip
    p.add_argument(
        "--head-addr",
        metavar="ADDR",
        help="the head node's address, MASTER_ADDR, that the other nodes "
        "reach (default env MASTER_ADDR on a plan across nodes, which needs one; 127.0.0.1 on one node)",
    )
    p.add_argument("--launcher", choices=("miles",), default="miles", help="the plan's launcher (Miles)")
    p.add_argument(
        "--train-only",
        action="store_true",
        help="Miles' trainer alone on the built-in engine's rollout "
        "file (--debug-train-only): the convert, the rollout file and the train-only launch",
    )
    p.set_defaults(func=cmd_plan)

    modules = {EXTERNAL[only]} if only in EXTERNAL else (set(EXTERNAL.values()) if only is None else set())
    for module in sorted(modules):
        try:
            importlib.import_module(module).register(sub)
        except ImportError:
            if only is not None:
                raise
    for command_parser in sub.choices.values():
        command_parser.set_defaults(parser=command_parser)
    return parser


# Commands that read no path of the user's and load no library that needs the working folder.
_NO_PATHS = ("cases", "plan")


def main(argv: list[str] | None = None) -> int:
    """0/1 the verdict, 2 and one `error: [rule] ... Fix:` line for bad input, 3 a crash (traceback logged)."""
    from rlsmoke.paths import cwd_exists, from_os_error

    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(command if command in EXTERNAL or command in _NO_PATHS else None)
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # named by the command's own parser: its --help lists what it takes
            args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command not in _NO_PATHS:
            cwd_exists(args.command)
            check_environment(args.command)
        # `prepare` writes a folder: a stop signal removes what it half-wrote (`run` sets its own handlers)
        if args.command == "prepare" and threading.current_thread() is threading.main_thread():
            from rlsmoke.engine import signals

            with signals.stopping_run():  # SIGTERM, SIGHUP, SIGQUIT clean up as Ctrl-C does
                return int(args.func(args))
        return int(args.func(args))
    except RlsmokeError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return ExitCode.USAGE
    # Ctrl-C, or SIGTERM, SIGHUP, SIGQUIT in `run` and `prepare` (errors.Interrupted)
    except KeyboardInterrupt as exc:
        import signal

        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"error: interrupted by {signal.Signals(signum).name}; the run stopped the workers it started",
              file=sys.stderr)  # fmt: skip
        return 128 + signum
    except OSError as exc:
        if exc.filename is None:  # no path of the user's to blame: a crash
            return crashed(command, exc)
        print(f"error: {from_os_error(exc).one_line()}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as exc:  # a bug: exit 3 (never 1, a failed gate), the traceback in a log
        return crashed(command, exc)


def check_environment(command: str) -> None:
    """The folders the environment names, checked before anything loads (a read-only cache passes)."""
    from rlsmoke.paths import check_dir

    if os.environ.get("RLSMOKE_CACHE"):
        check_dir(os.environ["RLSMOKE_CACHE"], "RLSMOKE_CACHE", must_exist=False,
                  fix="point RLSMOKE_CACHE at a folder (or unset it: ~/.cache/rlsmoke)")  # fmt: skip
    if command == "run":
        from rlsmoke.thresholds import thresholds_dirs

        thresholds_dirs()


def crashed(command: str | None, exc: BaseException) -> int:
    """Exit 3: the cause on one line, the traceback in a log file that the line names."""
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    try:
        fd, log = tempfile.mkstemp(prefix=f"rlsmoke-{command or 'cli'}-crash-", suffix=".log")
        with os.fdopen(fd, "w") as f:
            f.write(f"rlsmoke {command}: an unexpected exception\n{text}")
        where = f"Traceback in {log}"
    except OSError:  # nowhere to write it: the terminal is the only place left
        sys.stderr.write(text)
        where = "Traceback above"
    print(crash_line(command or "cli", exc, where), file=sys.stderr)
    return ExitCode.RUN_FAILED


if __name__ == "__main__":
    sys.exit(main())
