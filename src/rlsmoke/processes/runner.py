"""Run a launch: its own session, a clean env, logs tee'd to the artifacts folder, nothing left behind.

Every process gets `RLSMOKE_RUN_TOKEN=<token>`; at the end the session gets SIGTERM, then SIGKILL, then any
process still carrying the token (a setsid daemon, as Ray's) is killed by pid. Never by name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

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


def clean_env(extra: Mapping[str, str] = ()) -> dict[str, str]:
    """os.environ without proxy variables, plus `extra`; the interpreter's bin dir first."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    env.update(extra)
    for var in PROXY_VARS:  # a plan could not reintroduce one either
        env.pop(var, None)
    bindir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bindir:  # `python3`, `ray`, `rlsmoke` of this venv
        env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")])
    return env


def tree_pids(token: str, sid: int | None = None) -> list[int]:
    """Live pids of a launch: in session `sid`, or with `token` in their env; zombies excluded."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if sid is not None and int(fields[3]) == sid:
                found.append(int(entry))
            elif needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except (OSError, IndexError, ValueError):  # gone, or not ours to read
            continue
    return found


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen, token: str, grace: float = TERM_GRACE_S) -> None:
    """SIGTERM the session's group, wait up to `grace`, then SIGKILL every pid of the tree until none is left."""
    sid = proc.pid  # start_new_session: the leader's pid is the session and the group id
    _signal_group(sid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or tree_pids(token, sid)):
        time.sleep(0.1)
    for _ in range(100):  # a process may fork while we look; look again until nothing is left
        _signal_group(sid, signal.SIGKILL)
        pids = tree_pids(token, sid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def _tee(stream, log: TextIO, echo: TextIO | None) -> None:
    for line in iter(stream.readline, ""):
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(line)
    stream.close()


class Process:
    """One launched command in its own session, logged to `log`; `start` replaces the spawn when given."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], log: Path, cwd: str | Path | None = None,
                 token: str | None = None, echo: TextIO | None = None, grace: float = TERM_GRACE_S,
                 start=None):  # fmt: skip
        self.grace = grace
        self.argv = tuple(str(a) for a in argv)
        self.token = token or uuid.uuid4().hex
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._logf = self.log.open("a", encoding="utf-8")
        self._logf.write(f"$ {' '.join(self.argv)}\n")
        self._logf.flush()
        self.started = time.monotonic()
        out = self._logf.fileno()  # opened for appending: the command's lines and ours interleave whole
        self._reader = None
        if start is not None:
            self.proc = start(self.argv, {**env, TOKEN_VAR: self.token}, self.log)
            return
        self.proc = subprocess.Popen(
            self.argv, env={**env, TOKEN_VAR: self.token}, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if echo else out, stderr=subprocess.STDOUT, text=True, errors="replace",
            bufsize=1, start_new_session=True,
        )  # fmt: skip
        if echo is not None:
            self._reader = threading.Thread(
                target=_tee, args=(self.proc.stdout, self._logf, echo), daemon=True
            )
            self._reader.start()

    def wait(self, timeout: float | None) -> Result:
        timed_out = False
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except (
            BaseException
        ):  # Ctrl-C while waiting: the run is in a session of its own, which no terminal signals
            self.stop()
            raise
        rc = None if timed_out else self.proc.returncode
        if timed_out:
            self._logf.write(
                f"rlsmoke: timed out after {time.monotonic() - self.started:.0f} s; "
                "killing the process group\n"
            )
        self.stop()
        return Result(self.argv, rc, timed_out, time.monotonic() - self.started, self.log)

    def stop(self, grace: float | None = None) -> None:
        """Ends the whole tree (a finished leader may have left children running) and closes the log."""
        grace = self.grace if grace is None else grace
        if self.proc.poll() is None or tree_pids(self.token, self.proc.pid):
            stop_tree(self.proc, self.token, grace)
        if self._reader is not None:
            self._reader.join(timeout=grace)
        if not self._logf.closed:
            self._logf.flush()
            self._logf.close()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run(argv: Sequence[str], *, env: Mapping[str, str], log: Path, timeout: float | None, cwd=None,
        token: str | None = None, echo: TextIO | None = None, grace: float = TERM_GRACE_S, start=None) -> Result:  # fmt: skip
    """Run `argv` to completion (or `timeout` s), tee'd to `log`; leaves no process behind."""
    return Process(argv, env=env, log=log, cwd=cwd, token=token, echo=echo, grace=grace, start=start).wait(
        timeout
    )


# --- the Miles launcher: ray start --head, then ray job submit -----------------------------------


def ray_start_argv(ray_start: Sequence[str], ports, temp_dir: str) -> list[str]:
    """The plan's `ray start --head` with our ports, temp dir and `--block` (stopping it stops ours only)."""
    lo, hi = ports.worker_ports
    return [*ray_start, "--port", str(ports.gcs), "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(ports.dashboard), "--include-dashboard", "true",
            "--dashboard-agent-listen-port", str(ports.dashboard_agent_listen),
            "--dashboard-agent-grpc-port", str(ports.dashboard_agent_grpc),
            "--metrics-export-port", str(ports.metrics_export),
            "--node-manager-port", str(ports.node_manager), "--object-manager-port", str(ports.object_manager),
            "--runtime-env-agent-port", str(ports.runtime_env_agent),
            "--min-worker-port", str(lo), "--max-worker-port", str(hi),
            "--temp-dir", temp_dir, "--block", *_client_port(ports)]  # fmt: skip


def _client_port(ports) -> list[str]:
    """Ray starts a client server (default port 10001) only where `ray[client]` is installed; give it ours."""
    try:
        from ray._private.utils import get_ray_client_dependency_error
    except ImportError:
        return []
    if get_ray_client_dependency_error() is not None:
        return []
    return ["--ray-client-server-port", str(ports.client_server)]


def job_submit_argv(job_submit: Sequence[str], dashboard: int) -> list[str]:
    """The plan's `ray job submit ...` pointed at our dashboard port (the plan names Ray's default)."""
    argv = list(job_submit)
    i = argv.index("--address")
    host = argv[i + 1].split("//", 1)[-1].rsplit(":", 1)[0]
    argv[i + 1] = f"http://{host}:{dashboard}"
    return argv


def wait_dashboard(port: int, proc: Process, timeout: float) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"`ray start` exited with {proc.proc.returncode} before its dashboard came up; "
                               f"see {proc.log}")  # fmt: skip
        try:
            with opener.open(f"http://127.0.0.1:{port}/api/version", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"Ray's dashboard on port {port} did not answer within {timeout:.0f} s; see {proc.log}"
    )


def run_miles(launch, *, miles_root: Path, ports, env: Mapping[str, str], artifacts: Path,
              timeout: float, echo: TextIO | None = None) -> Result:  # fmt: skip
    """Upstream's launch under `miles_root`: a Ray head, the job, then stop Ray; `env` to every process."""
    started = time.monotonic()
    # Newer Ray's token auth: this cluster is loopback only, and its own probes carry no token.
    full_env = clean_env({**launch.env, **env, "RAY_AUTH_MODE": "disabled"})
    # Ray's unix sockets live under temp_dir and must stay under ~107 bytes, so not in the artifacts.
    temp_dir = tempfile.mkdtemp(prefix="rlsmoke-ray-")
    # Each Process has its own token: the job's stop must not SIGKILL the cluster before the head's stop.
    head = Process(ray_start_argv(launch.ray_start(), ports, temp_dir), env=full_env, cwd=miles_root,
                   log=artifacts / "ray-head.log")  # fmt: skip
    result = None
    try:
        wait_dashboard(ports.dashboard, head, timeout=min(120.0, timeout))
        runtime_env = json.dumps({"env_vars": {**launch.env, **env}})
        left = max(1.0, timeout - (time.monotonic() - started))
        submit = job_submit_argv(launch.job_submit(runtime_env), ports.dashboard)
        result = run(submit, env=full_env, cwd=miles_root, log=artifacts / "run.log", timeout=left, echo=echo)
    finally:
        head_died = head.proc.poll() is not None  # `ray start --block` ends only when we stop it
        head.stop(grace=HEAD_GRACE_S)  # Ray's logs say what went wrong: kept when something did
        if head_died or result is None or not result.ok:
            _keep_ray_logs(temp_dir, artifacts)
        shutil.rmtree(temp_dir, ignore_errors=True)
    return result


def _keep_ray_logs(temp_dir: str, artifacts: Path) -> None:
    logs = Path(temp_dir) / "session_latest" / "logs"
    if logs.is_dir():
        shutil.copytree(
            logs, artifacts / "ray-logs", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock")
        )
