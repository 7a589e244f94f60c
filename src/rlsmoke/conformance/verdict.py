"""A real parser's verdict on one plan: the plan fields the harness reads, and one real validator call
turned into a verdict (run in a conformance venv). Pure Python."""

from __future__ import annotations

import contextlib
import io
import os
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from unittest import mock

# Parser keys, in the order verdicts are reported, with the versions they pin.
PARSERS = {
    "miles": "miles-rl 0.0.2 (vendored Megatron-LM + bundled SGLang)",
    "sglang": "sglang 0.5.23",
    "mcore": "megatron-core 0.16.1",
}


@dataclass(frozen=True)
class Verdict:
    """`accepted` is None when the parser did not run (not installed, or the harness broke)."""

    parser: str  # a key of PARSERS
    accepted: bool | None
    message: str
    # False when the target renders another dialect: its rejection is drift, not a topology verdict.
    applies: bool = True

    def one_line(self) -> str:
        status = {None: "not run", True: "accepted", False: "rejected"}[self.accepted]
        scope = "" if self.applies else " (other target: drift check)"
        return f"{self.parser:7s} {status:9s}{scope} {self.message}".rstrip()

    def to_json(self) -> dict:
        return asdict(self)


def applies(parser: str, plan: dict) -> bool:
    """Whether `parser` is the version the plan's target renders flags for."""
    target = plan["topology"]["target_versions"]  # {"miles": ..., "sglang": "bundled" | "0.5.23"}
    if parser == "miles":
        return target["miles"] == "0.0.2" and target["sglang"] == "bundled"
    if parser == "sglang":
        return target["sglang"] == "0.5.23"
    return True  # megatron-core reads only the training grid


def not_run(parser: str, plans: list[dict], message: str) -> list[Verdict]:
    return [Verdict(parser, None, message, applies(parser, p)) for p in plans]


def describe_exception(exc: BaseException) -> str:
    """One line: the type, the message, and where the real code raised it (a bare assert has no message)."""
    if isinstance(exc, SystemExit):
        return f"exit {exc.code}"
    where = ""
    if frames := traceback.extract_tb(exc.__traceback__):
        last = frames[-1]
        short = last.filename.partition("/site-packages/")[2] or last.filename  # a path within its package
        where = f" at {short}:{last.lineno}"
        if not str(exc) and last.line:  # extract_tb read the line, stripped, from linecache
            where += f": `{last.line}`"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


def plan_env(plan: dict):
    """The job's runtime env, as Ray would set it, for the duration of one check."""
    return mock.patch.dict(os.environ, {k: str(v) for k, v in (plan.get("env") or {}).items()})


def run_validator(parser: str, fn: Callable[[], str], *, applies: bool = True) -> Verdict:
    """`fn` calls the real code and returns a note; anything it raises (argparse's exit) is a rejection."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            note = fn()
    except SystemExit as exc:
        lines = [ln.strip() for ln in err.getvalue().splitlines() if "error:" in ln]
        return Verdict(parser, False, (lines[-1] if lines else describe_exception(exc)), applies)
    except Exception as exc:  # the real validators raise AssertionError, ValueError, TypeError, ...
        return Verdict(parser, False, describe_exception(exc), applies)
    return Verdict(parser, True, note, applies)
