"""Every signal disposition rlsmoke sets is set here (SIGINT, SIGTERM, SIGHUP, SIGQUIT: `STOP`).

- loading the engine (`exit_at_once`): the process exits 128 + N at once, naming the signal;
- the run (`stopping_run`): `Interrupted(N)` in the main thread, so every `finally` stops what it
  started; inside an import it waits for the import's end; later signals are ignored, so a second
  cannot cut the cleanup short;
- while Ray starts or stops (`held`): blocked, since Ray installs its own handlers;
- a child (`in_child`) dies with its parent; a rank (`in_rank`) ends quietly on SIGINT;
- a run in the caller's process (`hosted`): the caller re-raises the signal afterwards;
- a pytest session: SIGTERM is Ctrl-C once (`sigterm_interrupts_session`).

The signal received first is the one reported: Ray's wait re-raises SIGTERM as a bare KeyboardInterrupt.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

from rlsmoke.errors import Interrupted

STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_received: list[int] = []
_hosted: list[bool] = []  # non-empty while a run is hosted in its caller's process: never exit it

# An interrupt inside an import leaves half a module behind, which the importer may swallow (torch imports
# numpy under a bare try) or trip over later: it waits until the import is over.
_IMPORT_FRAMES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def interrupted_by(exc: BaseException | None = None) -> str:
    """The name of the signal that stopped the run: the first received, else `exc`'s, else SIGINT."""
    return signal.Signals(_received[0] if _received else getattr(exc, "signum", signal.SIGINT)).name


def received() -> int | None:
    return _received[0] if _received else None


@contextlib.contextmanager
def _handling(handler) -> Iterator[None]:
    """`handler` for every STOP signal inside the block, the caller's again after it."""
    before = {signum: signal.signal(signum, handler) for signum in STOP}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


@contextlib.contextmanager
def stopping_run() -> Iterator[None]:
    """The run's handlers, from before anything starts until its records and verdict are written."""
    _received.clear()
    with _handling(_on_signal):
        yield


@contextlib.contextmanager
def exit_at_once(say: Callable[[int], None]) -> Iterator[None]:
    """While nothing has started: `say(signum)`, then exit 128 + signum. A hosted run keeps its handlers."""

    def exit_now(signum, frame):
        _received.append(signum)
        say(signum)
        os._exit(128 + signum)

    with contextlib.nullcontext() if _hosted else _handling(exit_now):
        yield


@contextlib.contextmanager
def held() -> Iterator[None]:
    """STOP signals wait (main thread) until the block ends; the handlers as it began are put back first."""
    if not can_host():
        yield
        return
    handlers = {signum: signal.getsignal(signum) for signum in STOP}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def in_child(parent: int) -> None:
    """At the start of a process the run started: STOP unblocked, and SIGKILL once `parent` is gone."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    try:
        with contextlib.suppress(PermissionError):
            os.kill(parent, 0)
    except ProcessLookupError:  # it ended before the prctl: nobody would send the signal
        os._exit(128 + signal.SIGKILL)


def in_rank() -> None:
    """At a rank process's start, after `in_child` (`engine.procs` calls that for every rank)."""
    for signum in STOP:
        signal.signal(signum, _rank_interrupted if signum == signal.SIGINT else signal.SIG_DFL)
    sys.unraisablehook = _rank_unraisable


class _RankInterrupted(SystemExit):
    pass


def _rank_interrupted(signum, frame) -> None:
    raise _RankInterrupted(128 + signum)  # multiprocessing ends a process on SystemExit without a traceback


def _rank_unraisable(unraisable) -> None:
    """A SIGINT that lands in a finalizer or a weakref callback: Python would print its SystemExit as
    "Exception ignored" with a traceback and go on; the rank ends there instead, as quietly."""
    if isinstance(unraisable.exc_value, _RankInterrupted):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(unraisable.exc_value.code)
    sys.__unraisablehook__(unraisable)


def _on_signal(signum, frame) -> None:
    if _inside_import(frame):
        threading.Thread(target=_deliver_after_import, args=(signum,), daemon=True).start()
        return
    for stop in STOP:  # once: a second signal must not cut the cleanup short
        signal.signal(stop, signal.SIG_IGN)
    _received.append(signum)
    raise Interrupted(signum)


def _inside_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename in _IMPORT_FRAMES:
            return True
        frame = frame.f_back
    return False


def _deliver_after_import(signum: int) -> None:
    while _inside_import(sys._current_frames().get(threading.main_thread().ident)):
        time.sleep(0.02)
    _thread.interrupt_main(signum)  # the handler again, in the main thread, now outside the import


# --- a run in its caller's process ---------------------------------------------------------------


def can_host() -> bool:
    """Handlers can be set only in the main thread."""
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def hosted(got: list[int]) -> Iterator[None]:
    """A stop signal is `Interrupted` wherever it lands in the block; `got` gets the signals received."""

    def interrupt(signum, frame):
        got.append(signum)
        raise Interrupted(signum)

    _hosted.append(True)
    try:
        with _handling(interrupt):
            yield
    finally:
        _hosted.pop()
        got.extend(_received)
        _received.clear()


# --- a pytest session ----------------------------------------------------------------------------

# `timeout` signals pytest, then its process group: a SIGTERM this soon after the first is the same request.
REPEATED_SIGTERM_S = 5.0


def sigterm_interrupts_session() -> Callable[[], None] | None:
    """SIGTERM (a CI job's timeout) becomes Ctrl-C once, so pytest's teardown ends the runs it spawned; a
    handler someone else set is kept (None). A fork gets the default back. Returns what restores it."""
    if not can_host() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    session_pid = os.getpid()
    ours = []

    def end_now() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def interrupt(signum, frame):
        if os.getpid() != session_pid:  # a fork the signal reached before its reset below
            end_now()
            return
        first = time.monotonic()

        def again(signum, frame):
            if time.monotonic() - first > REPEATED_SIGTERM_S:
                end_now()

        ours.append(again)
        signal.signal(signal.SIGTERM, again)
        raise KeyboardInterrupt("SIGTERM")

    ours.append(interrupt)

    def back_to_default() -> None:
        if signal.getsignal(signal.SIGTERM) in ours:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, interrupt)
    os.register_at_fork(after_in_child=back_to_default)
    return back_to_default
