"""Run a launch: its own session, a clean env, logs tee'd to the artifacts folder, nothing left behind.

Every process gets `RLSMOKE_RUN_TOKEN=<token>`; at the end the session gets SIGTERM, then SIGKILL, then any
process still carrying the token (a setsid daemon, as Ray's) is killed by pid. Never by name. The engine's
async mode runs on a local Ray cluster of its own, stopped the same way (`LocalRayCluster`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.engine import signals
from rlsmoke.errors import RunError

TOKEN_VAR = "RLSMOKE_RUN_TOKEN"
PROXY_VARS = ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "FTP_PROXY", "ALL_PROXY")  # fmt: skip
TERM_GRACE_S = 10.0  # SIGTERM -> SIGKILL of a launched command's tree
HEAD_GRACE_S = 0.5  # a Ray head's: its drain outlasted 30 s, and the cluster is ours and disposable


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int | None  # None: killed on timeout
    timed_out: bool
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, n: int) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return f"(no log at {self.log})"


def clean_env(extra: Mapping[str, str] = ()) -> dict[str, str]:
    """os.environ without proxy variables, plus `extra`; the interpreter's bin dir first."""
    # a plan could not reintroduce a proxy variable either
    env = {k: v for k, v in {**os.environ, **dict(extra)}.items() if k not in PROXY_VARS}
    bindir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bindir:  # `python3`, `ray`, `rlsmoke` of this venv
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    return env


# Newer Ray's token auth: the clusters started here are loopback only, and Ray's own probes carry no token.
LOOPBACK_RAY = {"RAY_AUTH_MODE": "disabled"}


def path_before_callers(first: str) -> str:
    """A PYTHONPATH of `first` (Miles' checkout, Megatron-LM), the caller's own after it."""
    return os.pathsep.join(filter(None, [first, os.environ.get("PYTHONPATH")]))


def tree_pids(token: str | None, sid: int) -> list[int]:
    """Live pids of a launch: in session `sid`, or with `token` (if any) in their env; zombies excluded."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):  # gone, or not ours to read
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            environ = Path(f"/proc/{entry}/environ")
            if int(fields[3]) == sid or (token and needle in environ.read_bytes().split(b"\0")):
                found.append(int(entry))
    return found


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_tree(proc: subprocess.Popen, token: str | None, grace: float = TERM_GRACE_S) -> None:
    """SIGTERM the session's group, wait up to `grace`, then SIGKILL every pid of the tree until none is left."""
    sid = proc.pid  # start_new_session: the leader's pid is the session and the group id
    _signal_group(sid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or tree_pids(token, sid)):
        time.sleep(0.1)
    for _ in range(100):  # a process may fork while we look; look again until nothing is left
        _signal_group(sid, signal.SIGKILL)
        if not (pids := tree_pids(token, sid)):
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


class Process:
    """One launched command in its own session, logged to `log`; `start` replaces the spawn when given."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: str | Path | None = None,
                 grace: float = TERM_GRACE_S, start=None):  # fmt: skip
        self.grace = grace
        self.argv = tuple(str(a) for a in argv)
        self.token = uuid.uuid4().hex
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._logf = self.log.open("a", encoding="utf-8")
        self._logf.write(f"$ {' '.join(self.argv)}\n")
        self._logf.flush()
        self.started = time.monotonic()
        env = {**env, TOKEN_VAR: self.token}
        if start is not None:
            self.proc = start(self.argv, env, self.log)
            return
        # the log is opened for appending: the command's lines and ours interleave whole
        self.proc = subprocess.Popen(
            self.argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=self._logf.fileno(), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait(self, timeout: float | None) -> Result:
        timed_out = False
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            took = time.monotonic() - self.started
            self._logf.write(f"rlsmoke: timed out after {took:.0f} s; killing the process group\n")
        except BaseException:  # Ctrl-C while waiting: its session of its own gets no terminal's signals
            self.stop()
            raise
        self.stop()
        rc = None if timed_out else self.proc.poll()
        return Result(self.argv, rc, timed_out, time.monotonic() - self.started, self.log)

    def stop(self, grace: float | None = None) -> None:
        """Ends the whole tree (a finished leader may have left children running) and closes the log."""
        grace = self.grace if grace is None else grace
        if self.proc.poll() is None or tree_pids(self.token, self.proc.pid):
            stop_tree(self.proc, self.token, grace)
        if not self._logf.closed:
            self._logf.flush()
            self._logf.close()


def run(argv: Sequence[str], *, env: Mapping[str, str], log: Path, timeout: float | None, cwd=None,
        start=None) -> Result:  # fmt: skip
    """Run `argv` to completion (or `timeout` s), its output appended to `log`; leaves no process behind."""
    return Process(argv, env=env, log=log, cwd=cwd, start=start).wait(timeout)


# --- the Miles launcher: ray start --head, then ray job submit -----------------------------------


def ray_head_ports(ports, temp_dir: str) -> list[str]:
    """A `ray start --head`'s flags for our leased ports, our temp dir and `--block` (the head is our session's
    leader: stopping it stops this cluster only, never another one on the host)."""
    lo, hi = ports.worker_ports
    return ["--port", str(ports.gcs), "--dashboard-agent-listen-port", str(ports.dashboard_agent_listen),
            "--dashboard-agent-grpc-port", str(ports.dashboard_agent_grpc),
            "--metrics-export-port", str(ports.metrics_export),
            "--node-manager-port", str(ports.node_manager), "--object-manager-port", str(ports.object_manager),
            "--runtime-env-agent-port", str(ports.runtime_env_agent),
            "--min-worker-port", str(lo), "--max-worker-port", str(hi), "--temp-dir", temp_dir, "--block"]  # fmt: skip


def under_ray_head(head_argv: Sequence[str], ports, job: Callable[[], Result], *, env: Mapping[str, str],
                   cwd: Path, artifacts: Path, timeout: float,
                   dashboard: Sequence[str] = ()) -> Result:  # fmt: skip
    """`job()` under a Ray head of ours; Ray's own logs say what went wrong, kept when something did."""
    # Ray's unix sockets live under temp_dir and must stay under ~107 bytes, so not in the artifacts.
    temp_dir = tempfile.mkdtemp(prefix="rlsmoke-ray-")
    # Each Process has its own token: the job's stop must not SIGKILL the cluster before the head's stop.
    head = Process([*head_argv, *ray_head_ports(ports, temp_dir), *dashboard], env=env, cwd=cwd,
                   log=artifacts / "ray-head.log")  # fmt: skip
    result = None
    try:
        wait_head(head, ports, timeout=min(120.0, timeout), what="dashboard" if dashboard else "GCS")
        result = job()
    finally:
        head_died = head.proc.poll() is not None  # `ray start --block` ends only when we stop it
        head.stop(grace=HEAD_GRACE_S)
        logs = Path(temp_dir) / "session_latest" / "logs"
        if (head_died or result is None or not result.ok) and logs.is_dir():
            shutil.copytree(
                logs, artifacts / "ray-logs", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock")
            )
        shutil.rmtree(temp_dir, ignore_errors=True)
    return result


def job_submit_argv(job_submit: Sequence[str], dashboard: int) -> list[str]:
    """The plan's `ray job submit ...` pointed at our dashboard port (the plan names Ray's default)."""
    argv = list(job_submit)
    i = argv.index("--address")
    host = argv[i + 1].split("//", 1)[-1].rsplit(":", 1)[0]
    argv[i + 1] = f"http://{host}:{dashboard}"
    return argv


def wait_head(head: Process, ports, timeout: float, what: str) -> None:
    """Until the head's dashboard (or its GCS) answers on its port; the head exiting first is an error."""
    port = ports.dashboard if what == "dashboard" else ports.gcs
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.proc.poll() is not None:
            raise RuntimeError(f"`ray start` exited with {head.proc.returncode} before its {what} came up; "
                               f"see {head.log}")  # fmt: skip
        if _answers(port, http=what == "dashboard"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"Ray's {what} on port {port} did not answer within {timeout:.0f} s; see {head.log}")


def _answers(port: int, *, http: bool) -> bool:
    """The port takes a connection; `http`: Ray's dashboard answers its version there."""
    if not http:
        with socket.socket() as s:
            s.settimeout(1.0)
            return s.connect_ex(("127.0.0.1", port)) == 0
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    with contextlib.suppress(OSError), opener.open(f"http://127.0.0.1:{port}/api/version", timeout=2) as resp:
        return resp.status == 200
    return False


# The cluster's own process: dies with the run (parent-death signal), reports the GCS address, sleeps.
_RAY_HEAD = """
import json, sys, time
from rlsmoke.engine.signals import in_child
in_child(int(sys.argv[1]))
import ray
ray.init(**json.loads(sys.argv[2]))
print(json.dumps({"address": ray.get_runtime_context().gcs_address}), flush=True)
while True:
    time.sleep(3600)
"""


class LocalRayCluster:
    """A one-node Ray cluster on loopback, in its own session; `address` is what `ray.init` connects to.

    `ray.init(address="local")` in the run's process installs Ray's SIGTERM handler while it starts, and an
    interrupt midway left its agents running. So a child in a session of its own starts the cluster, the run
    connects as a driver, and stopping kills every process of that session by pid.
    """

    def __init__(self, *, num_cpus: int, num_gpus: int, timeout: float = 120):
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rlsmoke-ray-"))
        self.proc: subprocess.Popen | None = None
        options = {"address": "local", "num_cpus": num_cpus, "num_gpus": num_gpus, "include_dashboard": False,
                   "_node_ip_address": "127.0.0.1", "_temp_dir": str(self.temp_dir), "log_to_driver": False,
                   "configure_logging": False}  # fmt: skip
        log = (self.temp_dir / "head.log").open("w")
        try:
            with signals.held():  # an interrupt now would leave a child that no one stops
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _RAY_HEAD, str(os.getpid()), json.dumps(options)],
                    stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                    # the driver's mode (unset means disabled to a driver given an address)
                    env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")},
                )  # fmt: skip
            deadline = time.monotonic() + timeout
            line = ""
            while not line:  # the head prints one line once its cluster is up, or exits
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.temp_dir / "head.log").read_text(errors="replace").strip().splitlines()[-5:]
                    raise RunError(f"the local Ray cluster did not start: {' | '.join(tail) or 'no output'}",
                                   rule="engine.ray_start")  # fmt: skip
                if select.select([self.proc.stdout], [], [], 0.2)[0]:
                    line = self.proc.stdout.readline()
            self.address = json.loads(line)["address"]
        except BaseException:
            self.stop()
            raise
        finally:
            log.close()

    def stop(self) -> None:
        """Kill every process of the cluster's session at once (Ray's drain is slow); drop its temp folder."""
        if self.proc is not None:
            # by session only: the run token this process inherited marks the whole run, not the cluster
            stop_tree(self.proc, None, grace=0)
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)
