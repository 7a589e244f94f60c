"""`python -m rlsmoke.cli ARGS` run in this process: a suite's CPU run in the pytest worker, which has
imported the engine once (a fresh interpreter spends about 5 s importing for a 2 s tiny run). A stop
signal stops it as it stops a spawned run, then is raised again for the caller's handler. A hang in
native code is what only a process boundary can cut: GPU runs are forked from multiprocessing's fork
server (`start_forked`: 11-20 s of imports less per run on an H200), ROCm's spawned (HIP cannot be asked).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from unittest import mock

from rlsmoke.engine import procs, signals
from rlsmoke.processes.runner import Result

MODULE_ARGV = ("-m", "rlsmoke.cli")


def can_run_here(argv: Sequence[str]) -> bool:
    """`argv` is this interpreter's `-m rlsmoke.cli ...`, and this is the main thread (signal handlers)."""
    return (
        len(argv) > 3 and argv[0] == sys.executable and tuple(argv[1:3]) == MODULE_ARGV and signals.can_host()
    )


def run_here(argv: Sequence[str], *, env: Mapping[str, str], log: Path, timeout: float | None,
             errors: Path | None = None) -> Result:  # fmt: skip
    """Run `argv` to completion or `timeout` s in this process, its output appended to `log`."""
    import rlsmoke.engine.run  # noqa: F401  torch and transformers: an interrupt now is the caller's own

    argv = tuple(str(a) for a in argv)
    started = time.monotonic()
    expired, done = threading.Event(), threading.Event()
    lock = threading.Lock()

    def expire() -> None:
        with lock:
            if not done.is_set():
                expired.set()  # the run then stops as on SIGTERM
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

    timer = threading.Timer(timeout, expire) if timeout else None
    code, got = None, list[int]()  # got: the stop signals the run received
    with log.open("a", encoding="utf-8") as out, contextlib.ExitStack() as stack:
        err = stack.enter_context(Path(errors).open("a", encoding="utf-8")) if errors else out
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        with contextlib.suppress(KeyboardInterrupt):  # a stop that landed outside `main`: `got` has it
            # patch.dict copies `env` before it clears os.environ, which `env` may be
            with mock.patch.dict(os.environ, env, clear=True), _output_to(out, err), signals.hosted(got):
                if timer is not None:
                    timer.start()
                try:
                    code = _exit_code(list(argv[3:]))
                finally:
                    with lock:
                        done.set()
                    if timer is not None:
                        timer.cancel()
        if expired.is_set():
            out.write(f"rlsmoke: timed out after {time.monotonic() - started:.0f} s; stopped the run\n")
    timed_out = expired.is_set()
    if got and not timed_out:
        signal.raise_signal(got[0])  # again, for the caller's own handler: pytest's ends the session
    return Result(argv, None if timed_out else code, timed_out, time.monotonic() - started, log)


def _exit_code(args: list[str]) -> int:
    """`python -m rlsmoke.cli ARGS` as an interpreter ends it: SystemExit's code, or a traceback and 1."""
    from rlsmoke.cli import main

    try:
        return int(main(args) or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # noqa: BLE001 - as `python -m` would: the traceback, exit 1
        traceback.print_exc()
        return 1


@contextlib.contextmanager
def _output_to(out, err) -> Iterator[None]:
    """sys.stdout and file descriptor 1 into `out`, sys.stderr and 2 into `err`, inside the block."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        for stream in (out, err):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


# --- forked from multiprocessing's fork server -------------------------------------------------

# What the fork server imports once (less what would start a GPU driver: `engine.procs.preloadable`)
PRELOAD = (
    "rlsmoke.run_command",
    "rlsmoke.engine.run",
    "rlsmoke.engine.sharded",
    "rlsmoke.engine.megatron.trainer",
)


class ForkedRun:
    """A run forked by multiprocessing's fork server, with the part of `subprocess.Popen` the runner uses."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        return self.process.exitcode


def start_forked(
    argv: Sequence[str], env: Mapping[str, str], log: Path, errors: Path | None = None
) -> ForkedRun:
    """`argv` forked from the fork server in a session of its own. For `runner.Process(start=...)`."""
    ctx = procs.RankContext()
    ctx.set_forkserver_preload([procs.SERVER_SETUP, *procs.preloadable((*procs.HEAVY_MODULES, *PRELOAD))])
    ready_r, ready_w = ctx.Pipe(duplex=False)
    args = (list(argv[3:]), dict(env), str(log), str(errors or log), ready_w)
    process = ctx.Process(target=_forked_main, args=args)
    process.start()
    ready_w.close()
    with contextlib.suppress(EOFError):
        ready_r.recv()  # it leads its own session now: the runner may stop it by group
    ready_r.close()
    return ForkedRun(process)


def _forked_main(args: list[str], env: dict, log: str, errors: str, ready) -> None:
    os.setsid()
    ready.send(True)
    ready.close()
    os.environ.clear()
    os.environ.update(env)
    for target, path in ((1, log), (2, errors)):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, target)
        os.close(fd)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda._is_in_bad_fork():  # the server had started a GPU driver
        print("rlsmoke: the fork server holds a GPU driver: a fresh interpreter runs this", file=sys.stderr)
        os.execv(sys.executable, [sys.executable, *MODULE_ARGV, *args])
    code = _exit_code(args)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    sys.exit(code)
