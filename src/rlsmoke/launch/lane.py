"""A lane: a small process that runs the commands it is given, `slots` at a time, one after another,
on cores that are idle.

The pytest plugin hands it the runs that go ahead of their tests (`rlsmoke.run_ahead`), so that a
finished run's slot takes the next one at once, even while the pytest process is busy inside a long
test. A run starts only while about a core has been idle for the last half second (/proc/stat), or
at once on the core a run of the lane just left, and runs LANE_NICE nicer than the session: the test
in front keeps the cores it takes up again. A claimed run (its test waits for it) starts at once, at
the session's priority. The lane imports no torch: its runs fork from the session's warm server
(`launch.warm`) or start cold, through `launch.runner`, which ends each run's whole tree.

Runs that rendezvous (several ranks) may overlap here, and with the test in front: each run the lane
starts is given a MASTER_PORT of its own, from the ports it was handed, in place of the session's.

Protocol, one JSON object per line. In: {"start": id, "argv", "env", "cwd", "log", "timeout", "yields"}
("yields": false, an unclaimed run starts at the session's priority; it still waits for an idle core),
{"claim": id} and {"cancel": id}. Out: {"done": id, "returncode", "seconds", "timed_out"} (returncode null: cancelled,
or killed at its timeout, which counts from the run's start). The lane
ends, stopping what still runs, when its input closes (the plugin's session ended, or died).
"""

from __future__ import annotations

import json
import os
import select
import sys
import threading
import time
from collections import deque

from rlsmoke.launch import runner

POLL_S = 0.05
# The lane's runs yield the CPU to the test in front: 10 nicer than the session, the kernel gives them
# about a tenth of a contended core and all of an idle one. A claimed run is the test in front: it
# takes the session's value back (where the user may raise a priority again).
LANE_NICE = 10
IDLE_WINDOW_S = 0.5
IDLE_CORES = 0.75  # what a tiny run needs: one thread's core


def _cpu_jiffies() -> tuple[int, int] | None:
    """(idle, total) jiffies of the host's cores since boot; None where /proc/stat is not there."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[3] + fields[4], sum(fields)  # idle + iowait; user .. steal


class IdleCores:
    """Idle cores over the last IDLE_WINDOW_S, from /proc/stat samples taken as the lane polls."""

    def __init__(self):
        self.cores = os.cpu_count() or 1
        self.samples: deque[tuple[float, int, int]] = deque()

    def sample(self) -> None:
        jiffies = _cpu_jiffies()
        if jiffies is not None:
            self.samples.append((time.monotonic(), *jiffies))
        while len(self.samples) > 2 and self.samples[1][0] <= time.monotonic() - IDLE_WINDOW_S:
            self.samples.popleft()

    def idle(self) -> float:
        if not self.samples:
            return float(self.cores)  # nothing to read: assume the spare cores are there
        (t0, idle0, total0), (t1, idle1, total1) = self.samples[0], self.samples[-1]
        if t1 - t0 < IDLE_WINDOW_S or total1 == total0:
            return 0.0  # not a whole window yet: wait for one
        return self.cores * (idle1 - idle0) / (total1 - total0)


class JsonLines:
    """JSON objects, one a line, read raw from a pipe: select() cannot see what a buffered reader holds."""

    def __init__(self, fd: int):
        self.fd = fd
        self._unread = b""  # read, not yet a whole line

    def read(self, timeout: float | None) -> list[dict] | None:
        """What came within `timeout` ([] when nothing did); None once the pipe is closed."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        chunk = os.read(self.fd, 65536)
        if not chunk:
            return None
        *lines, self._unread = (self._unread + chunk).split(b"\n")
        return [json.loads(line) for line in lines]


class WarmAttach:
    """The session's warm server, attached in a thread: attaching waits while the server still imports
    (seconds), and meanwhile the lane must go on reading its input, or the session blocks writing to it."""

    def __init__(self, socket_path: str | None):
        self.server = None
        self.ready = threading.Event()
        if socket_path:
            threading.Thread(target=self._attach, args=(socket_path,), daemon=True).start()
        else:
            self.ready.set()

    def _attach(self, socket_path: str) -> None:
        from rlsmoke.launch.warm import WarmServer

        try:
            self.server = WarmServer.attach(socket_path)
        except OSError:  # gone: every run starts cold
            self.server = None
        finally:
            self.ready.set()


def serve(socket_path: str | None, slots: int, ports: list[int], idle_cores: float) -> None:
    """`idle_cores`: how much of the host must have been idle for an unclaimed run to start."""
    warm = WarmAttach(socket_path)
    requests = JsonLines(sys.stdin.fileno())
    queued: deque[dict] = deque()
    claimed: deque[dict] = deque()  # their tests wait: they start as soon as the warm server is there
    running: dict[str, tuple[runner.Process, float]] = {}  # id -> the run, its timeout
    port_of: dict[str, int] = {}  # id -> the MASTER_PORT it was given
    idle = IdleCores()
    last_start = 0.0

    session_nice = os.getpriority(os.PRIO_PROCESS, 0)

    def renice(process: runner.Process, value: int) -> None:
        """The run leads a session and group of its own: its ranks, forked later, take its value."""
        try:
            os.setpriority(os.PRIO_PGRP, process.proc.pid, value)
        except OSError:  # ended already; or, back to the session's, not allowed to a user without the right
            pass

    def start_unclaimed(request: dict) -> None:
        """An unclaimed run yields to the session's processes, unless it asked not to."""
        start(request, min(session_nice + LANE_NICE, 19) if request.get("yields", True) else session_nice)

    def start(request: dict, nice: int) -> None:
        nonlocal last_start
        env = request["env"]
        if "MASTER_PORT" in env:
            port = next((p for p in ports if p not in port_of.values()), None)  # one per slot, one for a claim
            if port is not None:
                port_of[request["start"]] = port
                env = {**env, "MASTER_PORT": str(port)}
        process = runner.Process(request["argv"], env=env, cwd=request["cwd"], log=request["log"],
                                 warm=warm.server)  # fmt: skip
        if nice != session_nice:
            renice(process, nice)
        running[request["start"]] = (process, request["timeout"])
        last_start = time.monotonic()

    def take(run_id: str) -> dict | None:
        for waiting in (queued, claimed):
            for request in waiting:
                if request["start"] == run_id:
                    waiting.remove(request)
                    return request
        return None

    def done(run_id: str, returncode, seconds: float, timed_out: bool = False) -> None:
        port_of.pop(run_id, None)
        message = {"done": run_id, "returncode": returncode, "seconds": seconds, "timed_out": timed_out}
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    while (received := requests.read(POLL_S)) is not None:  # None: the session is over
        for request in received:
            if "start" in request:
                queued.append(request)
            elif "claim" in request and request["claim"] in running:
                renice(running[request["claim"]][0], session_nice)  # its test waits for it now
            elif "claim" in request and (waiting := take(request["claim"])) is not None:
                claimed.append(waiting)
            elif "cancel" in request:
                run_id = request["cancel"]
                if run_id in running:
                    running.pop(run_id)[0].stop()
                    done(run_id, None, 0.0)
                elif take(run_id) is not None:
                    done(run_id, None, 0.0)
        freed = 0  # cores our own runs held until now: the next runs may take them without a wait
        for run_id, (process, timeout) in list(running.items()):
            late = time.monotonic() - process.started > timeout
            if late or process.proc.poll() is not None:
                result = process.wait(0)
                del running[run_id]
                done(run_id, result.returncode, result.seconds, result.timed_out)
                freed += 1
        idle.sample()
        if not warm.ready.is_set():
            continue
        while claimed:
            start(claimed.popleft(), session_nice)  # its test waits for it: now, at the session's priority
            freed -= 1
        while queued and len(running) < slots and freed > 0 and freed >= idle_cores:
            start_unclaimed(queued.popleft())
            freed -= 1
        settled = time.monotonic() - last_start >= IDLE_WINDOW_S  # the last start's load shows by now
        if queued and len(running) < slots and settled and idle.idle() >= idle_cores:
            start_unclaimed(queued.popleft())
    for process, _ in running.values():
        process.stop()


if __name__ == "__main__":
    serve(sys.argv[1] or None, int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",") if p], float(sys.argv[4]))
