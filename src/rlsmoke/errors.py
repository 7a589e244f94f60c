"""Errors and exit codes: every error a user can cause is a `RlsmokeError`, one `error:` line and
`ExitCode.USAGE`; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import enum
import signal


class ExitCode(enum.IntEnum):
    OK = 0
    GATE_FAILED = 1  # the run finished and at least one gate failed
    USAGE = 2  # bad input: unknown case, invalid topology, corrupt checkpoint, ...
    RUN_FAILED = 3  # the run itself broke (NaN, OOM, a crashed process)
    # 128 + the signal, as a shell reports a process killed by it: 130 on Ctrl-C, 143 on SIGTERM
    INTERRUPTED_SIGINT = 130
    INTERRUPTED_SIGTERM = 143


class RlsmokeError(ValueError):
    """Bad user input. `rule` names what was violated; `fix` says what to change."""

    def __init__(self, message: str, *, rule: str = "", fix: str = ""):
        self.rule, self.fix = rule, fix
        super().__init__(message)

    def one_line(self) -> str:
        parts = [f"[{self.rule}]" if self.rule else "", str(self).rstrip(".") + "."]
        if self.fix:
            parts.append(f"Fix: {self.fix}")
        return " ".join(p for p in parts if p)


class UnknownNameError(RlsmokeError):
    """An unknown case, platform, model, key or option value."""


def require_known(key: str, value, names, *, rule: str = "") -> None:
    """`key=value is unknown` (rule `key.known` unless given) where `value` is not one of `names`."""
    if value not in names:
        raise UnknownNameError(
            f"{key}={value!r} is unknown", rule=rule or f"{key}.known", fix=f"use one of: {', '.join(names)}"
        )


def crash_line(command: str, exc: BaseException, where: str) -> str:
    """An unexpected exception's one line on the terminal: its cause as Python ends a traceback with."""
    import traceback  # only on a crash: `rlsmoke plan` starts without it

    cause = "".join(traceback.format_exception_only(exc)).strip().splitlines()[-1]
    return f"error: [{command}.crashed] {cause}. {where}"


class TopologyError(RlsmokeError):
    """One or more topology rules failed; `violations` lists each (rule, message, fix)."""

    def __init__(self, violations: list[tuple[str, str, str]]):
        self.violations = violations
        rule, message, fix = violations[0]
        others = [v[0] for v in violations[1:]]
        more = f" (+{len(others)} more: {', '.join(others)})" if others else ""
        super().__init__(message + more, rule=rule, fix=fix)


class CheckpointError(RlsmokeError):
    """A checkpoint is missing, corrupt or does not match its config. Names the file and the tensor."""


class RunError(RuntimeError):
    """The run broke (NaN/inf, OOM, crashed worker). Not a gate verdict."""

    def __init__(self, message: str, *, rule: str = ""):
        self.rule = rule
        super().__init__(message)


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM) asked the run to stop: raised in the main thread so every `finally` cleans up."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)
