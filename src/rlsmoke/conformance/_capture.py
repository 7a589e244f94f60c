"""Run one real validator call and turn what it raises into a verdict. Runs in a conformance venv."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator

from rlsmoke.conformance.verdict import Verdict, describe_exception


@contextlib.contextmanager
def plan_env(env: dict[str, str]) -> Iterator[None]:
    """The job's runtime env, as Ray would set it, for the duration of one check."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_validator(parser: str, fn: Callable[[], str], *, applies: bool = True) -> Verdict:
    """`fn` calls the real code and returns a note; anything it raises (argparse's exit) is a rejection."""
    err = io.StringIO()
    out = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            note = fn()
    except SystemExit as exc:
        lines = [ln.strip() for ln in err.getvalue().splitlines() if "error:" in ln]
        return Verdict(parser, False, (lines[-1] if lines else describe_exception(exc)), applies)
    except Exception as exc:  # the real validators raise AssertionError, ValueError, TypeError, ...
        return Verdict(parser, False, describe_exception(exc), applies)
    return Verdict(parser, True, note, applies)
