"""A lane: a small process that runs the commands it is given, `slots` at a time, one after another.

The pytest plugin hands it the runs that go ahead of their tests (`rlsmoke.run_ahead`), so that a
finished run's slot takes the next one at once, even while the pytest process is busy inside a long
test. The lane imports no torch: its runs fork from the session's warm server (`launch.warm`) or
start cold, through `launch.runner`, which ends each run's whole tree.

Protocol, one JSON object per line. In: {"start": id, "argv", "env", "cwd", "log", "timeout"} and
{"cancel": id}. Out: {"done": id, "returncode", "seconds", "timed_out"} (returncode null: cancelled,
or killed at its timeout, which counts from the run's start). The lane
ends, stopping what still runs, when its input closes (the plugin's session ended, or died).
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections import deque

from rlsmoke.launch import runner

POLL_S = 0.05


def serve(socket_path: str | None, slots: int, stdin=None, stdout=None) -> None:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    warm = None
    if socket_path:
        from rlsmoke.launch.warm import WarmServer

        try:
            warm = WarmServer.attach(socket_path)  # waits while the server still imports
        except OSError:  # gone: every run starts cold
            warm = None
    queued: deque[dict] = deque()
    running: dict[str, tuple[runner.Process, float]] = {}  # id -> the run, its timeout

    def done(run_id: str, returncode, seconds: float, timed_out: bool = False) -> None:
        message = {"done": run_id, "returncode": returncode, "seconds": seconds, "timed_out": timed_out}
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    fd = stdin.fileno()
    buffer = b""
    while True:
        readable, _, _ = select.select([fd], [], [], POLL_S)
        if readable:
            chunk = os.read(fd, 65536)
            if not chunk:  # the session is over
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                request = json.loads(line)
                if "start" in request:
                    queued.append(request)
                elif request.get("cancel") in running:
                    running.pop(request["cancel"])[0].stop()
                    done(request["cancel"], None, 0.0)
                elif any(r["start"] == request.get("cancel") for r in queued):
                    queued.remove(next(r for r in queued if r["start"] == request["cancel"]))
                    done(request["cancel"], None, 0.0)
        for run_id, (process, timeout) in list(running.items()):
            late = time.monotonic() - process.started > timeout
            if late or process.proc.poll() is not None:
                result = process.wait(0)
                del running[run_id]
                done(run_id, result.returncode, result.seconds, result.timed_out)
        while queued and len(running) < slots:
            request = queued.popleft()
            process = runner.Process(request["argv"], env=request["env"], cwd=request["cwd"], log=request["log"],
                                     warm=warm)  # fmt: skip
            running[request["start"]] = (process, request["timeout"])
    for process, _ in running.values():
        process.stop()


if __name__ == "__main__":
    serve(sys.argv[1] or None, int(sys.argv[2]))
