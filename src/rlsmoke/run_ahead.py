"""Case runs started ahead of their tests, on the cores a serial session leaves idle.

A serial session on a CPU host runs one tiny case at a time, on one core, while the others wait. A
test that takes its run from the `case_record` fixture declares the run as data (a `CaseRun`
parameter, or its module's CASE), so the plugin can start it before the test's turn: a lane process
(`launch.lane`) runs the next declared runs on the idle cores, a few at a time, each in the
folder the test's own `artifacts` will be. When its turn comes, the test claims its run only if it
would launch the very same one now (argv and environment, as submitted: the lane then gives each run
a rendezvous port of its own); otherwise the early run is stopped and the test launches its own.

Only CPU runs of the built-in engine go ahead: of one rank or several, colocated or async (an async
run's Ray cluster lives in a session the run itself ends, on SIGTERM too, which is how the lane
stops a run); never a test that will be skipped, and never under xdist, whose workers share the
cores out already (`platforms.share_cores`).

In a session with a lane, the modules whose tests declare runs go after the others (in their own
order): their runs then fill the cores the others leave idle, instead of running beside the busy
tests in front of them.

Tests marked `background` (modules that mostly wait on the processes they start: Ray, a fork server,
pip) go further: a second pytest session runs them in the lane, on a core the others leave idle, and
this session shows their reports at their turn, last (`BackgroundSession`). Under xdist, with -s,
--pdb, --trace or --run-ahead 0, they run here like any other test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rlsmoke.launch.lane import IDLE_CORES, JsonLines
from rlsmoke.launch.runner import Result
from rlsmoke.selection import effective_case
from rlsmoke.suite import CaseLaunch, CaseRun, PendingCase

PORT_BLOCK_START = 100  # where the lane's port leases are looked for: away from xdist workers' (0..)
# Runs handed to the lane beyond its slots and not yet claimed, finished ones too: what an early end
# would waste (idle cores' time). Fewer leave the lane with nothing to run while long tests wait.
MAX_WAITING = 48
PHASE_VARS = frozenset({"PYTEST_CURRENT_TEST"})  # pytest sets it anew in each phase of every test


def declared_run(item) -> CaseRun | None:
    """The run a test takes from `case_record`: its parameter, else its module's CASE."""
    if "case_record" not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "case_record" in callspec.params:
        spec = callspec.params["case_record"]
    else:
        case = getattr(getattr(item, "module", None), "CASE", None)
        spec = CaseRun(case) if case is not None else None
    return spec if isinstance(spec, CaseRun) else None


def early_run(item, will_skip: Callable[[object], bool], num_gpus: int | None = None) -> CaseRun | None:
    """The item's declared run when it may start early: a CPU run of the built-in engine, in a test
    that will not be skipped."""
    spec = declared_run(item)
    if spec is None or will_skip(item) or effective_case(spec.case, num_gpus).platform != "cpu":
        return None
    return spec


def background_last(items: Sequence, background: set[str]) -> list:
    """`items` with the background ones (by node id) moved behind the others, in their order."""
    return [item for item in items if item.nodeid not in background] + [
        item for item in items if item.nodeid in background]


def declared_runs_last(items: Sequence, will_skip: Callable[[object], bool], num_gpus: int | None = None) -> list:
    """`items` with the modules that declare a run that may start early moved behind the others.

    Each module's tests stay together and in order, so its module fixtures are set up once.
    """
    def module(item) -> str:
        return item.nodeid.split("::", 1)[0]

    declaring = {module(item) for item in items if early_run(item, will_skip, num_gpus) is not None}
    return [item for item in items if module(item) not in declaring] + [
        item for item in items if module(item) in declaring]


class Lane:
    """The pytest side of a `launch.lane` process: submit runs, wait for one, cancel one."""

    def __init__(self, warm, slots: int, ports: Sequence[int] = (), idle_cores: float = IDLE_CORES):
        """`idle_cores`: how much of the host must be idle for an unclaimed run to start (0: at once)."""
        self.proc = subprocess.Popen([sys.executable, "-m", "rlsmoke.launch.lane", warm.socket_path if warm else "",
                                      str(slots), ",".join(map(str, ports)), str(idle_cores)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        self.finished: dict[str, dict] = {}
        self._replies = JsonLines(self.proc.stdout.fileno())

    def _send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()

    def submit(self, run_id: str, argv, env: dict, log: Path, timeout: float, *, cwd: str | None = None,
               yields: bool = True) -> None:  # fmt: skip
        """`yields`: the run starts nicer than the session; else at its priority (both wait for an idle core)."""
        self._send({"start": run_id, "argv": list(argv), "env": env, "cwd": cwd or os.getcwd(), "log": str(log),
                    "timeout": timeout, "yields": yields})  # fmt: skip

    def wait(self, run_id: str, timeout: float | None = None) -> dict | None:
        """The run's {"returncode", "seconds", "timed_out"}; None when the lane has not said after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while run_id not in self.finished:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            received = self._replies.read(left)
            if received is None:
                raise RuntimeError(f"the run-ahead lane exited with {self.proc.wait()}")
            if not received and left is not None and time.monotonic() >= deadline:
                return None
            self.finished.update((message["done"], message) for message in received)
        return self.finished.pop(run_id)

    def claim(self, run_id: str) -> None:
        """Its test waits for it: the lane starts it now if it has not yet."""
        self._send({"claim": run_id})

    def cancel(self, run_id: str) -> None:
        self._send({"cancel": run_id})
        self.wait(run_id, 60)

    def close(self) -> None:
        self.proc.stdin.close()  # the lane stops what still runs, then exits
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class BackgroundSession:
    """The background tests, run by a second pytest session (`argv`) that writes each report to
    `reports` as a JSON line (the plugin's --reports-to); this session shows them at their turn."""

    RUN_ID = "background-session"
    TIMEOUT_S = 3600.0  # the lane's limit on the whole session; each test keeps its own

    def __init__(self, nodeids: Sequence[str], argv: Sequence[str], env: dict, cwd: str, log: Path):
        self.nodeids = list(nodeids)
        self._ids = set(self.nodeids)
        self.folder = Path(tempfile.mkdtemp(prefix="rlsmoke-background-"))
        self.reports = self.folder / "reports.jsonl"
        self.argv = [*argv, "--reports-to", str(self.reports), *self.nodeids]
        self.env, self.cwd, self.log = env, cwd, log
        self.submitted = False
        self.done: dict | None = None  # the lane's word on the session, once it ended
        self._read = 0  # bytes of `reports` taken in
        self._reports: dict[str, list[dict]] = {}
        self._finished: set[str] = set()

    def __contains__(self, nodeid: str) -> bool:
        return nodeid in self._ids

    def _take_in(self) -> None:
        try:
            with open(self.reports, "rb") as f:
                f.seek(self._read)
                chunk = f.read()
        except FileNotFoundError:
            return
        whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for its end
        self._read += len(whole)
        for line in whole.splitlines():
            message = json.loads(line)
            if "finished" in message:
                self._finished.add(message["finished"])
            else:
                self._reports.setdefault(message["nodeid"], []).append(message["report"])

    def reports_of(self, nodeid: str, lane: Lane) -> list[dict] | None:
        """The test's serialized reports once it finished there; None if the session ended without them."""
        while True:
            self._take_in()
            if nodeid in self._finished:
                return self._reports.pop(nodeid, [])
            if self.done is not None:
                return None
            self.done = lane.wait(self.RUN_ID, 0.1)

    def missing(self, nodeid: str) -> str:
        """Why the test has no reports: the session's end, as the lane told it (`reports_of` gave None)."""
        how = "was stopped at its timeout" if self.done["timed_out"] else f"exited with {self.done['returncode']}"
        return (f"rlsmoke: the background pytest session {how} before {nodeid} reported; its output: {self.log}. "
                "--run-ahead 0 runs the test in this session")  # fmt: skip

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class RunAhead:
    """Hands the declared runs of later tests to a lane (`slots` at a time) and each to its test; and
    the background tests, if any, to a second session there."""

    def __init__(self, items: Sequence, slots: int, artifacts_for: Callable, will_skip: Callable[[object], bool],
                 num_gpus: int | None = None, warm=None, background: BackgroundSession | None = None):  # fmt: skip
        self.items = list(items)
        self.slots = slots
        self._artifacts_for = artifacts_for  # item -> the Artifacts its `artifacts` fixture will give
        self._will_skip = will_skip
        self._num_gpus = num_gpus
        self._index = {item.nodeid: i for i, item in enumerate(self.items)}
        self._next = 0  # items before this one were looked at already
        self.submitted: dict[str, tuple[CaseRun, CaseLaunch]] = {}  # nodeid -> its run, until claimed
        self._environ = dict(os.environ)
        self._lane: Lane | None = None
        self._port_leases: list = []
        self.claimed = 0
        self._warm = warm
        self.background = background
        self._background_claimed = False

    def _started_lane(self) -> Lane:
        """The lane, started at its first use with a leased port block for each run it may hold at once:
        its slots and a claim."""
        if self._lane is None:
            from rlsmoke.launch.lease import lease_ports

            self._port_leases = [lease_ports(start=PORT_BLOCK_START + i) for i in range(self.slots + 1)]
            self._lane = Lane(self._warm, self.slots, [lease.master for lease in self._port_leases])
        return self._lane

    def owns(self, nodeid: str) -> bool:
        """Whether the item's folder holds a run started ahead (its `artifacts` must not empty it)."""
        return nodeid in self.submitted

    def between_tests(self, item) -> None:
        """Called as `item`'s setup begins: the environment no test has changed yet, which runs
        submitted later, inside a test, start from."""
        self._environ = dict(os.environ)
        self.advance(item)

    def start_background(self) -> None:
        """Hand the background session to the lane, ahead of every run: its tests are the longest."""
        bg = self.background
        if bg is not None and not bg.submitted:
            bg.submitted = True
            self._started_lane().submit(bg.RUN_ID, bg.argv, bg.env, bg.log, bg.TIMEOUT_S, cwd=bg.cwd, yields=False)

    def replays(self, nodeid: str) -> bool:
        return self.background is not None and nodeid in self.background

    def background_reports(self, nodeid: str) -> list[dict] | None:
        """The background test's serialized reports, waited for (the session is claimed: it starts now if
        it has not yet); None when the session ended without them."""
        if not self._background_claimed:
            self._background_claimed = True
            self._lane.claim(self.background.RUN_ID)
        return self.background.reports_of(nodeid, self._lane)

    def advance(self, current) -> None:
        """Submit the runs of the items after `current`, up to MAX_WAITING beyond the lane's slots."""
        position = self._index.get(current.nodeid)
        if position is None or self.slots <= 0:
            return
        self._next = max(self._next, position + 1)
        while self._next < len(self.items) and len(self.submitted) < MAX_WAITING + self.slots:
            item = self.items[self._next]
            self._next += 1
            spec = early_run(item, self._will_skip, self._num_gpus)
            if spec is None or self.replays(item.nodeid):  # a background test's run is the other session's
                continue
            art = self._artifacts_for(item)
            shutil.rmtree(art.path, ignore_errors=True)  # as the fixture would: no stale summary is read
            try:
                launch = spec.plan(art, environ=self._environ, verify=True)
            except Exception:  # a refusal, a corrupt checkpoint: the test meets it again, in its own report
                shutil.rmtree(art.path, ignore_errors=True)
                continue
            self._started_lane().submit(item.nodeid, launch.argv, launch.env, launch.art.path / "pytest-run.log",
                                         launch.timeout)  # fmt: skip
            self.submitted[item.nodeid] = (spec, launch)

    def claim(self, item, spec: CaseRun, art) -> tuple[PendingCase, object] | None:
        """The item's run if one went ahead and is the one `spec` would launch now under `art`, waited
        for, with the Artifacts its record is to be kept with."""
        entry = self.submitted.pop(item.nodeid, None)
        if entry is None:
            return None
        self.advance(item)  # this run is the one in front now: the lane takes the next ones
        submitted_spec, launch = entry
        planned = spec.plan(art)
        changed = difference(planned, launch) if submitted_spec == spec else "the declared run"
        if changed:
            self._lane.cancel(item.nodeid)
            shutil.rmtree(art.path, ignore_errors=True)
            art.path.mkdir(parents=True)
            (art.path / "pytest-run.log").write_text(f"rlsmoke: the run started ahead had another {changed}; "
                                                     "stopped it and launched this one\n")  # fmt: skip
            return None
        self.claimed += 1
        self._lane.claim(item.nodeid)
        waited = self._lane.wait(item.nodeid)  # the lane kills a run at its timeout
        result = Result(launch.argv, waited["returncode"], waited["timed_out"], waited["seconds"],
                        launch.art.path / "pytest-run.log")  # fmt: skip
        return PendingCase(launch, result=result), planned.art

    def stop(self) -> None:
        """Stop the runs no test claimed (the session ended early) and remove their folders."""
        if self._lane is not None:
            self._lane.close()
        for lease in self._port_leases:
            lease.release()
        self._port_leases.clear()
        for _, launch in self.submitted.values():
            shutil.rmtree(launch.art.path, ignore_errors=True)
        self.submitted.clear()
        if self.background is not None:
            self.background.close()


def difference(planned, launched) -> str:
    """What differs between two launches ("" when they are the same run): the argv, or the variables."""
    if planned.argv != launched.argv:
        return "argv"
    names = {k for k in planned.env.keys() | launched.env.keys() if planned.env.get(k) != launched.env.get(k)}
    return f"environment ({', '.join(sorted(names - PHASE_VARS))})" if names - PHASE_VARS else ""
