"""The checkpoints a GPU session will read, prepared side by side as it starts. Left to its tests, each
builds its own when it starts (the one-H200 suite on a fresh host: GLM-4.5's, Flash's and GLM-5's ready 55,
112 and 161 s in, one after another; side by side 65-72 s). Each is `rlsmoke prepare CASE`, launched as
the runner launches a run (a session of its own, ended whole); a test whose checkpoint is still being
written waits on the cache's lock, then reads it."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlsmoke.checkpoints.cache import cached_folder
from rlsmoke.facts import SYNTHESIS_THREADS
from rlsmoke.processes import runner


def default_jobs(n_cases: int) -> int:
    """As many at once as the cores hold at SYNTHESIS_THREADS threads each, at least one."""
    return max(1, min(n_cases, (os.cpu_count() or 1) // SYNTHESIS_THREADS))


def missing(cases: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """(name, tiny) of `cases` with no folder in the cache yet, each once, in order. A folder that is there
    is verified by the run that reads it, as ever."""
    unique = list(dict.fromkeys(cases))
    return [(name, tiny) for name, tiny in unique if not cached_folder(name, tiny=tiny).is_dir()]


class PreparedAhead:
    """`rlsmoke prepare` of each case, `jobs` at a time, logs in `log_dir/<case>[-tiny].log`. `close()` ends
    what is still running (an interrupted session): a checkpoint is written into a temporary folder and
    renamed whole, so an ended one leaves nothing half-written in the cache."""

    def __init__(self, cases: list[tuple[str, bool]], log_dir: Path, *, jobs: int):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir, self.closed = log_dir, False
        self._live: dict[str, runner.Process] = {}
        self._lock = threading.Lock()
        self.exit_codes: dict[str, int | None] = {}
        self._pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="rlsmoke-prepare")
        self.futures = [self._pool.submit(self._prepare, name, tiny) for name, tiny in cases]

    def _prepare(self, name: str, tiny: bool) -> None:
        argv = [sys.executable, "-m", "rlsmoke.cli", "prepare", name, "--tiny" if tiny else "--no-tiny"]
        label = f"{name}{'-tiny' if tiny else ''}"
        with self._lock:
            if self.closed:
                return
            self._live[label] = proc = runner.Process(argv, env=os.environ, log=self.log_dir / f"{label}.log")
        result = proc.wait(None)
        with self._lock:
            self._live.pop(label, None)
            self.exit_codes[label] = result.returncode

    def wait(self) -> dict[str, int | None]:
        for f in self.futures:
            f.result()
        return dict(self.exit_codes)

    def close(self, grace_s: float = runner.TERM_GRACE_S) -> None:
        with self._lock:
            self.closed = True  # nothing more starts
            live = list(self._live.values())
        for proc in live:
            proc.stop(grace_s)
        self._pool.shutdown(wait=True, cancel_futures=True)
