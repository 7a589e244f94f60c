"""The `rlsmoke` command. Exit codes: see `rlsmoke.errors.ExitCode`.

`cases` and `plan` import neither torch nor transformers; the other subcommands live in their own
packages and are imported only when asked for.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys

from rlsmoke.cases import CASE_NAMES, add_case_args, case_from_args
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.launch.diff import diff_platforms

# Subcommands registered by other packages: name -> module with `register(subparsers)`.
EXTERNAL = {
    "prepare": "rlsmoke.checkpoints.cli",
    "verify": "rlsmoke.checkpoints.cli",
    "run": "rlsmoke.engine.cli",
    "report": "rlsmoke.report",
    "calibrate": "rlsmoke.calibration",
}


class _Parser(argparse.ArgumentParser):
    """Usage errors are one `error:` line and exit 2, like every other bad input."""

    def error(self, message: str):  # noqa: D401
        sys.stderr.write(f"error: [usage] {message}. Fix: see `{self.prog} --help`.\n")
        sys.exit(ExitCode.USAGE)


def cmd_cases(args) -> int:
    for name in CASE_NAMES:
        print(name)
    return ExitCode.OK


def shell_script(plan) -> str:
    """The launch as a readable, shell-safe script: env, then argv one group per line."""
    lines = ["#!/usr/bin/env bash", f"# rlsmoke plan {plan.case.name} --platform {plan.topology.platform} "
             f"--num-gpus {plan.topology.num_gpus} --mode {plan.topology.mode}", "set -euo pipefail"]  # fmt: skip
    lines += [f"export {k}={shlex.quote(v)}" for k, v in plan.launch.env.items()]
    lines.append(shlex.join(plan.launch.argv[:2]) + " \\")
    body = [toks for toks in plan.launch.groups.values() if toks]
    for i, toks in enumerate(body):
        tail = " \\" if i < len(body) - 1 else ""
        lines.append(f"  {shlex.join(toks)}{tail}")
    return "\n".join(lines)


def cmd_plan(args) -> int:
    case = case_from_args(args)
    plan = case.plan(validate=not args.no_validate)
    if args.diff:
        print(diff_platforms(case, args.diff))
        return ExitCode.OK
    if args.format == "json":
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(shell_script(plan))
    if args.check:
        return _check(plan)
    return ExitCode.OK


def _check(plan) -> int:
    """The real parsers' verdicts; only those of the plan's own target decide (the other dialect must fail)."""
    from rlsmoke.conformance import check_plan, format_verdicts, real_verdict

    verdicts = check_plan(plan.to_json())
    print(format_verdicts(verdicts), file=sys.stderr)
    return ExitCode.GATE_FAILED if real_verdict(verdicts) is False else ExitCode.OK


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="rlsmoke", description="One-step end-to-end tests for GRPO on large MoE models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("cases", help="list the case names")
    p.set_defaults(func=cmd_cases)

    p = sub.add_parser("plan", help="validate a case's topology and render its Miles launch")
    add_case_args(p)
    p.add_argument("--format", choices=("shell", "json"), default="shell")
    p.add_argument("--diff", metavar="PLATFORM", help="print the flags and env that differ on PLATFORM")
    p.add_argument("--check", action="store_true", help="also run the real Miles/SGLang/Megatron validators")
    p.add_argument("--no-validate", action="store_true", help="render even if a topology rule fails")
    p.set_defaults(func=cmd_plan)

    modules = {EXTERNAL[only]} if only in EXTERNAL else (set(EXTERNAL.values()) if only is None else set())
    for module in sorted(modules):
        try:
            importlib.import_module(module).register(sub)
        except ImportError:
            if only is not None:
                raise
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(command if command in EXTERNAL or command in ("cases", "plan") else None)
        args = parser.parse_args(argv)
        return int(args.func(args))
    except RlsmokeError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
