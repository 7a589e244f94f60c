"""What the pytest plugin decides, checks and holds, as plain functions: its options, a test's GPU need and
declared run, its artifacts root (one session's at a time), a live run's folder, and the commit its
history records."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from rlsmoke.facts import RUN_TIMEOUT_S, SYNTHESIS_THREADS, in_words

SESSION_LOCK = ".pytest-session.lock"  # in the artifacts root: one session's at a time
TIMEOUT_DEFAULTS = in_words(RUN_TIMEOUT_S, "{:.0f}".format)  # "900 on cpu, 3600 on nvidia and rocm"
AHEAD_DEFAULT = f"the cores / {SYNTHESIS_THREADS}"  # builds side by side, each on SYNTHESIS_THREADS threads


def check_options(config: pytest.Config) -> None:
    """Bad option values end the session before any test runs."""
    timeout = config.getoption("run_timeout", None)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise pytest.UsageError(f"--run-timeout={timeout} must be a number of seconds > 0. Drop it for the "
                                f"default ({TIMEOUT_DEFAULTS})")  # fmt: skip
    if (ahead := config.getoption("prepare_ahead", None)) is not None and ahead < 0:
        fix = f"Pass 0 to leave each checkpoint to its test, or drop it for the default ({AHEAD_DEFAULT})"
        raise pytest.UsageError(f"--prepare-ahead={ahead} must be >= 0. {fix}")
    if history := config.getoption("history", None):
        if (path := Path(history)).is_dir():
            raise pytest.UsageError(f"--history={path} is a folder. Pass a sqlite file (made if missing)")
        if path.is_file() and path.stat().st_size:
            with path.open("rb") as f:
                if f.read(16) != b"SQLite format 3\x00":
                    raise pytest.UsageError(f"--history={path} is not a sqlite database. Pass another file "
                                            "(made if missing)")  # fmt: skip


def hold_artifacts_root(root: Path) -> int:
    """The artifacts root is this session's until it ends: a second session on it is refused at once
    (its `artifacts` fixture would empty folders this one's runs write)."""
    from rlsmoke.artifacts import try_lock

    root.mkdir(parents=True, exist_ok=True)
    if (fd := try_lock(root / SESSION_LOCK)) is None:
        holder = (root / SESSION_LOCK).read_text(errors="replace").strip() or "?"
        raise pytest.UsageError(f"the artifacts folder {root} is in use by another pytest session (pid {holder}). "
                                "Pass --artifacts-dir DIR, or wait for it to end")  # fmt: skip
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def refuse_a_live_run(folder: Path) -> None:
    """A run that still holds its folder's lock (`artifacts.RunFolder`) keeps its folder: the test fails."""
    from rlsmoke.artifacts import LOCK_NAME, try_lock

    for lock in folder.rglob(LOCK_NAME) if folder.is_dir() else ():
        try:
            fd = try_lock(lock, os.O_RDONLY)
        except OSError:  # released meanwhile
            continue
        if fd is None:
            pytest.fail(f"{lock.parent} is held by a live run; this test's artifacts folder is left as it is. "
                        "End that run, or pass --artifacts-dir DIR", pytrace=False)  # fmt: skip
        os.close(fd)


def commit_of(config: pytest.Config) -> str:
    import subprocess

    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=config.rootpath, capture_output=True, text=True,
                             timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def requirement_of(item: pytest.Item):
    """The test's `selection.Requirement` (None for a unit test); a malformed gpus marker ends the session."""
    from rlsmoke.selection import requirement

    mark = item.get_closest_marker("gpus")
    if mark is not None and (len(mark.args) != 1 or not isinstance(mark.args[0], int) or mark.args[0] < 1):
        raise pytest.UsageError(
            f"{item.nodeid}: gpus{mark.args} is wrong. Write @pytest.mark.gpus(N) with N >= 1"
        )
    gpus = mark.args[0] if mark is not None else None
    return requirement((m.name for m in item.iter_markers()), gpus, item.config.getoption("num_gpus"))


def declared_run(item: pytest.Item):
    """The run a test takes from `case_record`: its parameter, else its module's CASE."""
    from rlsmoke.suite import CaseRun

    if (callspec := getattr(item, "callspec", None)) is not None and "case_record" in callspec.params:
        spec = callspec.params["case_record"]
        return spec if isinstance(spec, CaseRun) else None
    module = getattr(item, "module", None)
    case = getattr(module, "CASE", None)
    return CaseRun(case, shared=tuple(getattr(module, "SHARED_RUN", ()))) if case is not None else None


def gpu_checkpoints(items: list[pytest.Item], num_gpus: int | None) -> list[tuple[str, bool]]:
    """(case, tiny) of the checkpoint each GPU test that is not skipped will read, in the tests' order."""
    from rlsmoke.cases import Case
    from rlsmoke.selection import GPU_PLATFORMS, effective_case

    cases = []
    for item in items:
        if item.get_closest_marker("skip") is not None or (run := declared_run(item)) is None:
            continue
        # a unit module's CASE may be a case's name
        if isinstance(run.case, Case) and run.case.platform in GPU_PLATFORMS:
            case = effective_case(run.case, num_gpus)
            cases.append((case.name, case.tiny))
    return cases
