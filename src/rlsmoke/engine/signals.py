"""Which signal does what in an `rlsmoke run` process, and when. Every handler the engine sets is set here.

    when                                  SIGINT and SIGTERM
    ------------------------------------  ----------------------------------------------------------------
    loading the engine (`exit_at_once`)   nothing has started: run.log and stderr name the signal, the
                                          process exits 128 + N at once
    the run (`stopping_run`)              `Interrupted(N)` in the main thread, so every `finally` stops
                                          what it started (workers, ranks, the Ray cluster). Inside an
                                          import it waits for the import's end (half a module would stay
                                          behind). The first one counts: both are ignored afterwards, so a
                                          second cannot cut the cleanup short (SIGKILL still can)
    Ray starts, connects, shuts down      blocked until Ray is done, then the run's handlers are put back:
    (`held`)                              Ray installs its own (an abort with a stack dump, or death)
    the Ray cluster's head process        unblocked again in the head (it inherits the mask); it ends
                                          with the run (the parent-death signal), by `LocalCluster.stop`
    a rank process (`in_rank`)            SIGINT ends the rank quietly: a terminal's Ctrl-C reaches the
                                          whole group, and the driver, which got it too, stops the run.
                                          SIGTERM: the default action
    after the records and the verdict     the caller's handlers again

The signal received first is the one the run reports (`interrupted_by`): Ray's wait re-raises a
SIGTERM as a bare KeyboardInterrupt, which must not read as SIGINT.
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

STOP = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []

# The import machinery's frames: an interrupt raised inside an import leaves half a module behind, which
# the importer may swallow (torch imports numpy under a bare try) or trip over later ("cannot load module
# more than once"). Such an interrupt waits until the import is over.
_IMPORT_FRAMES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def interrupted_by(exc: BaseException | None = None) -> str:
    """The name of the signal that stopped the run: the first received, else `exc`'s, else SIGINT."""
    signum = _received[0] if _received else getattr(exc, "signum", signal.SIGINT)
    return signal.Signals(signum).name


def received() -> int | None:
    return _received[0] if _received else None


@contextlib.contextmanager
def _handling(handler) -> Iterator[None]:
    """`handler` for SIGINT and SIGTERM inside the block, the caller's again after it."""
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
    """While nothing has started: `say(signum)`, then exit 128 + signum without unwinding."""

    def exit_now(signum, frame):
        _received.append(signum)
        say(signum)
        os._exit(128 + signum)

    with _handling(exit_now):
        yield


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM wait (in the main thread) until the block ends; the handlers in place as it
    began are put back before they arrive. Threads and processes started inside inherit the mask."""
    if threading.current_thread() is not threading.main_thread():
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


def in_rank() -> None:
    """At a rank process's start: it may have been forked from its driver, with the driver's handlers."""
    signal.signal(signal.SIGINT, _rank_interrupted)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _rank_interrupted(signum, frame) -> None:
    raise SystemExit(128 + signum)  # multiprocessing ends a process on SystemExit without a traceback


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
    main = threading.main_thread().ident
    while _inside_import(sys._current_frames().get(main)):
        time.sleep(0.02)
    _thread.interrupt_main(signum)  # the handler again, in the main thread, now outside the import
