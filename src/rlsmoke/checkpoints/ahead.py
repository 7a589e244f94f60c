"""The checkpoints a GPU session will read, prepared side by side as it starts. Left to its tests, each
builds its own when it starts (the one-H200 suite on a fresh host: GLM-4.5's, Flash's and GLM-5's ready 55,
112 and 161 s in, one after another). Each is `rlsmoke prepare CASE` in a process group of its own; a
test whose checkpoint is still being written waits on the cache's lock, then reads it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlsmoke.checkpoints.cache import cache_key, cache_root

# `synthesize`'s chunk makers: threads a checkpoint prepares with (shards.write_shards)
THREADS_EACH = 4


def default_jobs(n_cases: int) -> int:
    """As many at once as the cores hold at THREADS_EACH threads each, at least one."""
    return max(1, min(n_cases, (os.cpu_count() or 1) // THREADS_EACH))


def missing(cases: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """(name, tiny) of `cases` with no folder in the cache yet, each once, in order. A folder that is there
    is verified by the run that reads it, as ever."""
    seen: list[tuple[str, bool]] = []
    for name, tiny in cases:
        key = cache_key(name, tiny=tiny, seed=0, dialect=None, fp8=False)
        if (name, tiny) not in seen and not (cache_root() / key).is_dir():
            seen.append((name, tiny))
    return seen


class PreparedAhead:
    """`rlsmoke prepare` of each case, `jobs` at a time, logs in `log_dir/<case>[-tiny].log`. `close()` ends what is
    still running (an interrupted session): a checkpoint is written into a temporary folder and renamed
    whole, so an ended one leaves nothing half-written in the cache."""

    def __init__(self, cases: list[tuple[str, bool]], log_dir: Path, *, jobs: int):
        self.log_dir, self.closed = log_dir, False
        log_dir.mkdir(parents=True, exist_ok=True)
        self._live: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self.exit_codes: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="rlsmoke-prepare")
        self.futures = [self._pool.submit(self._prepare, name, tiny) for name, tiny in cases]

    def _prepare(self, name: str, tiny: bool) -> int:
        argv = [sys.executable, "-m", "rlsmoke.cli", "prepare", name, "--tiny" if tiny else "--no-tiny"]
        label = f"{name}{'-tiny' if tiny else ''}"
        with self._lock:
            if self.closed:
                return -1
            with open(self.log_dir / f"{label}.log", "w") as log:
                # a group of its own: close() ends it and all it started
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self._live[label] = proc
        code = proc.wait()
        with self._lock:
            self._live.pop(label, None)
            self.exit_codes[label] = code
        return code

    def wait(self) -> dict[str, int]:
        for f in self.futures:
            f.result()
        return dict(self.exit_codes)

    def close(self, grace_s: float = 10.0) -> None:
        with self._lock:
            self.closed = True  # nothing more starts
            live = list(self._live.values())
        for proc in live:
            _end_group(proc, grace_s)
        self._pool.shutdown(wait=True, cancel_futures=True)


def _end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the process group we started (its own session), then SIGKILL after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
