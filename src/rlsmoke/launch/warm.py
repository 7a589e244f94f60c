"""Warm `rlsmoke run` processes: each one forked from a server that imported the engine once.

A fresh `python -m rlsmoke.cli run` on a CPU host spends about 5 s importing torch and transformers
before a tiny run that itself takes about 2 s; on an H200 host the imports took 11-20 s of a run. The
server (`python -m rlsmoke.launch.warm SOCKET`) imports them once; a run is then a fork of it with the
caller's argv, environment, working folder and output pipe, in a session of its own, and it exits
with the status a fresh interpreter would give.
`launch.runner` ends a forked run's tree as it ends a spawned one's (its session, then its token).

A run is forked only where that gives the same run as a fresh interpreter (`WarmServer.accepts`):
`-m rlsmoke.cli run` on the CPU or the NVIDIA platform, or `prepare` / `verify` (the checkpoint
tools, which never touch a GPU), under the server's values of every variable read while modules
import (thread counts, torch's, the hub's, Python's own). PYTHONPATH may differ: the fork
searches its cwd, then that PYTHONPATH, then the rest, as `python -m` does, unless a folder it adds
holds a module the server imported (or a sitecustomize) or a folder it drops is one the server
imported from; then it execs a fresh interpreter in place and says so. Any other command is spawned
as before. The server ends when the process that started it does (its stdin closes; on Linux also
PR_SET_PDEATHSIG, which reaches it while it still imports), so it never outlives its session.
On a host with a GPU, should the server's imports have initialized its driver, a run's fork could not
use CUDA (torch refuses: "Cannot re-initialize CUDA in forked subprocess", even for a CPU run's first
CUDA query) where a fresh interpreter can: then each `run` execs a fresh interpreter in place
(`driver_refusal`). One difference stays: every fork shares the server's string-hash seed, where fresh
interpreters each draw one; nothing in a run depends on it.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlsmoke.engine.procs import HEAVY_MODULES, device_count_by_nvml, gpu_driver_initialized, preloadable

_PARENT_VAR = "RLSMOKE_WARM_PARENT"
SERVER_VAR = "RLSMOKE_RUN_SERVER"  # the socket of a session's server: nested sessions fork from it too
MODULE = "rlsmoke.cli"
CPU_COMMANDS = ("run", "prepare", "verify")  # `run` only on FORKED_PLATFORMS; the checkpoint tools never use a GPU
# An NVIDIA run's fork initializes its own driver (the server never does: `driver_refusal` checks).
# ROCm runs are spawned: HIP's runtime is mapped as torch imports and cannot be asked.
FORKED_PLATFORMS = ("cpu", "nvidia")
# Read at interpreter start or while modules import (OpenMP and BLAS as they load, torch's and the hub's
# settings): a fork of a server started under other values would differ. GPU variables are not here:
# the driver reads them as it initializes, in the fork (the server never initializes it).
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "TORCH_", "PYTORCH_", "TRANSFORMERS_",
                        "HF_", "LD_", "MALLOC_")  # fmt: skip
# The interpreter's own, read as it starts (PYTHONUNBUFFERED is applied to each fork's output instead;
# PYTHONBREAKPOINT is read at each breakpoint() call, and Ray's driver sets it).
INTERPRETER_VARS = frozenset({
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONOPTIMIZE", "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONMALLOC", "PYTHONDEVMODE",
    "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC", "PYTHONINTMAXSTRDIGITS", "PYTHONPLATLIBDIR", "PYTHONVERBOSE",
    "PYTHONDEBUG", "PYTHONCOERCECLOCALE", "PYTHONLEGACYWINDOWSSTDIO",
})  # fmt: skip
PRELOAD = (
    "rlsmoke.engine.cli",
    "rlsmoke.engine.run",
    "rlsmoke.engine.placement",
    "rlsmoke.engine.sharded",
    "rlsmoke.engine.megatron.model",  # with megatron-core's modules below, where it is installed
    "rlsmoke.engine.megatron.trainer",
    "safetensors.torch",
    "tokenizers",
    *HEAVY_MODULES,  # what the ranks import
)
READY_TIMEOUT_S = 300.0
# Compared in the fork instead: it rebuilds sys.path as a fresh interpreter would, or execs one where
# the new path would find another copy of a module the server imported (`_fresh_search_path`).
FORK_SETTLED_VARS = frozenset({"PYTHONPATH"})
SITE_HOOKS = frozenset({"sitecustomize", "usercustomize"})


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) or k in INTERPRETER_VARS}


def _platform(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--platform" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--platform="):
            return arg.split("=", 1)[1]
    return None


class ForkedRun:
    """A run forked by the server, with the part of `subprocess.Popen` the runner uses."""

    def __init__(self, argv: Sequence[str], conn: socket.socket, stdout_fd: int | None):
        self.args = list(argv)
        self.returncode: int | None = None
        self._conn = conn
        self._reply = conn.makefile("r", encoding="utf-8")
        line = self._reply.readline()
        if not line.startswith("pid "):
            conn.close()
            if stdout_fd is not None:
                os.close(stdout_fd)
            raise OSError(f"the warm run server did not fork the run ({line.strip() or 'no answer'})")
        self.pid = int(line.split()[1])
        self.stdout = None if stdout_fd is None else open(stdout_fd, encoding="utf-8", errors="replace", newline=None)  # noqa: SIM115

    def _finish(self) -> None:
        line = self._reply.readline()
        if line.startswith("status "):
            self.returncode = os.waitstatus_to_exitcode(int(line.split()[1]))
        else:  # the server is gone, and with it the status: wait for the run itself, then call it killed
            while _alive(self.pid):
                time.sleep(0.05)
            self.returncode = -signal.SIGKILL
        self._reply.close()
        self._conn.close()

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class WarmServer:
    """The client's handle: start (or attach to) a server, fork runs from it, stop it."""

    def __init__(self, socket_path: str | Path, proc: subprocess.Popen | None, env: Mapping[str, str]):
        self.socket_path = str(socket_path)
        self.proc = proc  # None: attached to a server some other process started and stops
        self.import_env = import_time_env(env)
        self.outer_var: str | None = None  # the plugin keeps an outer session's server address here
        self._ready = proc is None

    @classmethod
    def start(cls, env: Mapping[str, str] | None = None) -> WarmServer:
        """Start a server in the background; it imports while the caller goes on (the first fork waits)."""
        env = dict(os.environ if env is None else env)
        folder = tempfile.mkdtemp(prefix="rlsmoke-warm-")  # unix socket paths must stay short
        path = os.path.join(folder, "server.sock")
        proc = subprocess.Popen([sys.executable, "-m", __name__, path], env={**env, _PARENT_VAR: str(os.getpid())},
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=None, start_new_session=True)  # fmt: skip
        return cls(path, proc, env)

    @classmethod
    def attach(cls, socket_path: str, env: Mapping[str, str] | None = None) -> WarmServer:
        """A handle on a running server (a nested session's); its import env is asked from it."""
        server = cls(socket_path, None, {})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not os.path.exists(socket_path) and os.path.isdir(os.path.dirname(socket_path)):
            if time.monotonic() > deadline:  # its folder lives as long as the server: it is still importing
                break
            time.sleep(0.1)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(socket_path)
            conn.sendall(b"E")
            server.import_env = json.loads(conn.makefile("r").readline())
        return server

    def refusal(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """Why a fork would not give the run a fresh interpreter gives; None when it would."""
        if not (len(argv) > 3 and argv[0] == sys.executable and list(argv[1:3]) == ["-m", MODULE]
                and argv[3] in CPU_COMMANDS):  # fmt: skip
            return f"not `{sys.executable} -m {MODULE}` {' | '.join(CPU_COMMANDS)}"
        if argv[3] == "run" and _platform(argv) not in FORKED_PLATFORMS:
            return f"not a --platform {' | '.join(FORKED_PLATFORMS)} run"
        theirs = import_time_env(env)
        differ = sorted(k for k in theirs.keys() | self.import_env.keys()
                        if theirs.get(k) != self.import_env.get(k) and k not in FORK_SETTLED_VARS)  # fmt: skip
        if differ:
            return f"{', '.join(differ)} differ from the values the warm server imported under"
        return None

    def accepts(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        return self.refusal(argv, env) is None

    def _wait_ready(self) -> None:
        if self._ready:
            return
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            raise OSError(f"the warm run server did not start (exit code {self.proc.poll()})")
        self._ready = True

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | Path | None,
             outputs: tuple[int, int] | None = None) -> ForkedRun:  # fmt: skip
        """Fork `argv` from the server. Its stdout and stderr go to `outputs` (two fds), else to one
        pipe, the returned run's `stdout`."""
        self._wait_ready()
        read_fd, write_fd = os.pipe() if outputs is None else (None, None)
        conn = socket.socket(socket.AF_UNIX)
        try:
            conn.connect(self.socket_path)
            socket.send_fds(conn, [b"F"], [write_fd, write_fd] if outputs is None else list(outputs))
            _send(conn, {"argv": list(argv), "env": dict(env), "cwd": str(cwd or os.getcwd())})
        except OSError:
            conn.close()
            if read_fd is not None:
                os.close(read_fd)
            raise
        finally:
            if write_fd is not None:
                os.close(write_fd)
        return ForkedRun(argv, conn, read_fd)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str], timeout: float | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """`subprocess.run(argv, capture_output=True, text=True)`, forked where `accepts` says it may be."""
        cold = lambda: subprocess.run(argv, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout)  # noqa: E731
        if not self.accepts(argv, env):
            return cold()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                run = self.fork(argv, env, cwd, outputs=(out.fileno(), err.fileno()))
            except OSError:  # the server died: the same run, started cold
                return cold()
            try:
                run.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
                raise
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(list(argv), run.returncode, out.read().decode(errors="replace"),
                                               err.read().decode(errors="replace"))  # fmt: skip

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.stdin.close()  # the server's cue to exit, read once it has imported
        if not self._ready:  # still importing: nothing forked yet, so nothing to wait for
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc.stdout.close()
        shutil.rmtree(os.path.dirname(self.socket_path), ignore_errors=True)


def run_captured(argv: Sequence[str], *, env: Mapping[str, str], timeout: float | None = None,
                 server: WarmServer | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """`subprocess.run(argv, capture_output=True, text=True)`, forked from `server` where it accepts."""
    if server is None:
        return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout)
    return server.run(argv, env=env, timeout=timeout)


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _receive(conn: socket.socket) -> dict:
    head = _read_exactly(conn, 4)
    return json.loads(_read_exactly(conn, struct.unpack("!I", head)[0]))


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = conn.recv(n)
        if not chunk:
            raise EOFError("the client hung up")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# --- the server ------------------------------------------------------------------------------------


def import_each(names, imported=lambda name, seconds, missing: None) -> None:
    """Import `names` in order, passing over an optional part that is not installed (megatron-core);
    `imported(name, seconds, ImportError or None)` hears of each as it ends (bench/warm_gpu_probe.py
    reports on the driver after each)."""
    for name in names:
        started, missing = time.perf_counter(), None
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = exc
        imported(name, time.perf_counter() - started, missing)


def _preload(imported=lambda name, seconds, missing: None) -> None:
    """What the server imports before it forks anything; `imported` as for `import_each`."""
    import warnings

    # megatron-core's notes on missing extras: a fork that imports it says them. Nothing here may start
    # the GPU driver that the forks inherit: not fla's modeling, and no device count through the driver.
    with warnings.catch_warnings(), device_count_by_nvml():
        warnings.simplefilter("ignore")
        import_each(preloadable(PRELOAD), imported)
    _build_load_tables()


def _build_load_tables() -> None:
    """What every run's first `from_pretrained` builds once per process: transformers' table of
    checkpoint conversions (about a thousand regular expressions, 0.3-0.4 s). Built here, each fork has it."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # another transformers: its first load builds what it needs
        return
    get_checkpoint_conversion_mapping("glm_moe_dsa")


def serve(socket_path: str) -> None:
    """Accept fork requests until the client closes our stdin; report each run's pid, then its status."""
    _preload()
    # What the imports made lives as long as the server: out of the collector's reach, a fork's
    # collections no longer walk it (0.25 s each) nor write to its pages (a copy each).
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop: the reaping is below
    runs: dict[int, socket.socket] = {}  # pid -> the connection its status goes to
    os.write(1, b"ready\n")  # the server's only output; each fork writes to its request's pipe
    stdin = sys.stdin.buffer.raw
    while True:
        try:
            ready = select.select([listener, wake_r, stdin], [], [])[0]
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(runs)
        if stdin in ready and not stdin.read(4096):
            break
        if listener in ready:
            conn, _ = listener.accept()
            try:
                pid = _accept(conn, listener, (wake_r, wake_w), runs)
            except (OSError, EOFError, ValueError) as exc:
                print(f"rlsmoke warm server: dropped a request: {exc}", file=sys.stderr)
                conn.close()
                continue
            if pid is not None:
                runs[pid] = conn
    listener.close()
    for conn in runs.values():  # the runs go on in their sessions; the runner stops them, not us
        conn.close()


def _reap(runs: dict[int, socket.socket]) -> None:
    while runs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = runs.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"status {status}\n".encode())
            except OSError:  # the client is gone
                pass
            conn.close()


def _accept(conn: socket.socket, listener, server_fds, runs) -> int | None:
    kind, fds, _, _ = socket.recv_fds(conn, 1, 2)
    if kind != b"F" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        if kind == b"E":  # an attaching client asks what the server imported under
            conn.sendall((json.dumps(import_time_env(os.environ)) + "\n").encode())
        conn.close()
        return None
    request = _receive(conn)
    sys.stdout.flush()
    sys.stderr.flush()
    in_session_r, in_session_w = os.pipe()
    # asked here, before the fork: on an H200 a fork of a server that had initialized CUDA did not read
    # as initialized in the child
    request["driver_initialized"] = gpu_driver_initialized()
    pid = os.fork()
    if pid == 0:
        os.close(in_session_r)
        listener.close()
        for other in runs.values():
            other.close()
        _run_child(request, fds, conn, (*server_fds, in_session_w))  # never returns
    for fd in fds:
        os.close(fd)
    os.close(in_session_w)
    os.read(in_session_r, 1)  # EOF once the fork leads its own session: the runner may stop it by group
    os.close(in_session_r)
    conn.sendall(f"pid {pid}\n".encode())
    return pid


def _run_child(request: dict, outputs: list[int], conn: socket.socket, server_fds) -> None:
    """In the fork: become a fresh `python -m rlsmoke.cli ...` with the request's argv, env and cwd."""
    code = 1
    try:
        os.close(conn.detach())  # the server's copy stays open: the status goes there
        os.setsid()
        signal.set_wakeup_fd(-1)
        for fd in server_fds:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(outputs[0], 1)
        os.dup2(outputs[1], 2)
        for fd in outputs:
            os.close(fd)
        env = request["env"]
        unbuffered = env.get("PYTHONUNBUFFERED", "") != ""
        sys.stdout.reconfigure(line_buffering=False, write_through=unbuffered)
        sys.stderr.reconfigure(line_buffering=True)
        server_path = os.environ.get("PYTHONPATH", "")
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        cold = _fresh_search_path(server_path, env.get("PYTHONPATH", ""))
        if not cold and request["argv"][3] == "run":  # the checkpoint tools never touch a GPU
            cold = driver_refusal(request.get("driver_initialized", False))
        if cold:  # this interpreter cannot be the run's: become a fresh one, same pid, session and output
            print(f"rlsmoke: started cold: {cold}", file=sys.stderr, flush=True)
            os.execve(request["argv"][0], request["argv"], env)
        code = _run_module(request["argv"][3:])
    except BaseException:  # noqa: BLE001 - the fork must never return into the server's loop
        import traceback

        traceback.print_exc()
    finally:
        os._exit(_shutdown(code))


def driver_refusal(server_initialized_it: bool) -> str:
    """Why this fork cannot be the run (its GPU driver is the server's, initialized); "" when it can.
    Two views of one fact: the server's driver, asked before the fork, and torch's own mark on a child
    forked after its CUDA start."""
    torch = sys.modules.get("torch")
    bad_fork = torch is not None and bool(getattr(torch.cuda, "_is_in_bad_fork", lambda: False)())
    if server_initialized_it or bad_fork:
        return "the warm server's GPU driver is initialized: a fork could not use CUDA"
    return ""


def _path_entries(pythonpath: str) -> list[str]:
    return [os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p]


def _provides(folder: str, names: set[str]) -> set[str]:
    """The top-level modules among `names` that `folder` holds (a package, a module or an extension)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return set()
    found = set()
    for entry in entries:
        name = entry.split(".", 1)[0]
        if name in names and (entry == name or entry.endswith((".py", ".pyc", ".so", ".pyd"))):
            found.add(name)
    return found


def _fresh_search_path(server_pythonpath: str, run_pythonpath: str) -> str:
    """Make sys.path what `python -m` gives in the run's cwd under its PYTHONPATH; "" when done, else why not.

    A fresh interpreter searches the cwd, then PYTHONPATH, then the rest. What the server imported
    stays imported, so the fork is that interpreter only if no folder it adds holds a module the
    server imported, and no folder it drops is one the server imported from.
    """
    if sys.flags.safe_path:  # PYTHONSAFEPATH / -P: no cwd entry (the server has the same flag)
        return "PYTHONSAFEPATH set: the search path is not rebuilt" if server_pythonpath != run_pythonpath else ""
    ours = [os.path.abspath(sys.path[0]), *_path_entries(server_pythonpath)]
    theirs = [os.getcwd(), *_path_entries(run_pythonpath)]
    if ours == theirs:
        return ""
    if [os.path.abspath(p) for p in sys.path[: len(ours)]] != ours:
        return "the warm server's sys.path no longer starts with its cwd and PYTHONPATH"
    imported = {name.split(".", 1)[0] for name in sys.modules}
    for folder in theirs:
        # a fresh interpreter would run a sitecustomize it finds there as it starts
        shadowed = _provides(folder, imported | SITE_HOOKS) if folder not in ours else set()
        if shadowed:
            return (f"{folder} (cwd or PYTHONPATH) holds {', '.join(sorted(shadowed))}, which a fresh interpreter "
                    "would import from there")  # fmt: skip
    for folder in ours:
        if folder in theirs:
            continue
        used = sorted(n for n in _provides(folder, imported)
                      if (getattr(sys.modules.get(n), "__file__", None) or "").startswith(os.path.join(folder, n)))  # fmt: skip
        if used:
            return f"the warm server imported {used[0]} from {folder}, which this run's search path lacks"
    rest = sys.path[len(ours):]
    sys.path[:] = [*theirs, *(p for p in rest if p not in theirs)]
    return ""


def _run_module(args: list[str]) -> int:
    """`python -m rlsmoke.cli ARGS`: the exit code an interpreter would give, traceback included."""
    import runpy

    sys.modules.pop(MODULE, None)  # as in a fresh `-m`: the module runs as __main__, not yet imported
    sys.argv = ["-m", *args]
    try:
        runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # as CPython does: the traceback, then death by SIGINT
        import traceback

        traceback.print_exc()
        _shutdown(0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _shutdown(code: int) -> int:
    """What an interpreter does at exit: join non-daemon threads, run atexit, flush."""
    import atexit
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return code & 0xFF


def _end_with_parent() -> None:
    """SIGTERM when the process that started us ends, even while we import (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed stdin still ends us once imported
        return
    if os.getppid() != int(os.environ.get(_PARENT_VAR, os.getppid())):  # it ended before the prctl
        sys.exit(0)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m rlsmoke.launch.warm SOCKET")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the folder below goes with us, even mid-import
    try:
        _end_with_parent()
        serve(sys.argv[1])
    finally:  # the socket and its folder (the client removes them too when it stops us)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # already ending: a late one would only break the exit
        shutil.rmtree(os.path.dirname(sys.argv[1]), ignore_errors=True)


if __name__ == "__main__":
    main()
