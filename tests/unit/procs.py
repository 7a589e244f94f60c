"""What the process tests read from /proc (a process's state, whether it lives, its descendants), a
call in a child process of its own, and `rlsmoke ...` run in this process (`run_cli`)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from rlsmoke.processes import here


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]; OSError when gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def alive(pid: int | str) -> bool:
    """Running or sleeping; a zombie is dead (only not yet reaped, by init in a container)."""
    try:
        return stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def descendants(root: int) -> set[int]:
    """Every process under `root` now, so a test can check that each one ends."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat_fields(stat.parent.name)[1]), []).append(int(stat.parent.name))
        except OSError:
            continue
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


class InAChild:
    """`fn(conn, *args)` started in a process from `ctx` (a multiprocessing context); `reply()` is what
    it sends on `conn`. Meanwhile this process goes on (a second walk beside it, on the idle core)."""

    def __init__(self, ctx, fn, *args):
        self._reader, writer = ctx.Pipe(duplex=False)
        self._child = ctx.Process(target=fn, args=(writer, *args))
        self._child.start()
        writer.close()  # the child's copy is its own: EOF here means it is gone

    def sent(self, timeout: float) -> bool:
        """Whether the child has sent its reply within `timeout` seconds."""
        return self._reader.poll(timeout)

    def reply(self, timeout: float = 120):
        try:
            assert self._reader.poll(timeout), (f"the child sent nothing within {timeout} s "
                                                f"(exit code {self._child.exitcode})")  # fmt: skip
            return self._reader.recv()
        finally:
            self._child.join(10)
            if self._child.is_alive():
                self._child.kill()
                self._child.join()


def in_a_child(ctx, fn, *args, timeout: float = 120):
    """`fn(conn, *args)` in a process of its own, waited for. For what must not happen in the pytest
    process: a process group, a changed sys.path."""
    return InAChild(ctx, fn, *args).reply(timeout)


def run_cli(argv, *, env, timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)` for
    `python -m rlsmoke.cli ...`, run in this process (`rlsmoke.processes.here`) where it can be."""
    if not here.can_run_here(argv):
        return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        result = here.run_here(argv, env=env, log=out, errors=err, timeout=timeout)
        if result.timed_out:
            raise subprocess.TimeoutExpired(list(argv), timeout)
        stdout = out.read_text(errors="replace").split("\n", 1)[1]  # less the `$ argv` line
        return subprocess.CompletedProcess(
            list(argv), result.returncode, stdout, err.read_text(errors="replace")
        )


class ForkedCli:
    """The part of `subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, start_new_session=True)`
    the process tests use, for `python -m rlsmoke.cli ...` forked from multiprocessing's fork server
    (`processes.here.start_forked`): the run as a spawned one, without an interpreter's imports."""

    def __init__(self, argv, folder: Path | None = None, env=None, setup=None, stdout: str | None = None):
        """`setup` (picklable, called in the child before `rlsmoke.cli.main`) is what a test asks more of
        the process, as `preexec_fn` would: a file-size limit, a patched function, a search path.
        `stdout` replaces the folder's stdout file (os.devnull: a file-size limit binds only the run's files).
        Without `folder`, the output goes to a temporary one that `communicate` removes."""
        self._own = None if folder else tempfile.TemporaryDirectory(prefix="rlsmoke-io-")
        folder = Path(self._own.name) if self._own else folder
        folder.mkdir(parents=True, exist_ok=True)
        self._out, self._err = folder / "stdout", folder / "stderr"
        for path in (self._out, self._err):
            path.write_text("")
        if stdout is not None:
            self._out = Path(stdout)
        env = dict(os.environ if env is None else env)
        if setup is None:
            self._run = here.start_forked(argv, env, self._out, self._err)
        else:
            self._run = _start_forked_with(setup, argv, env, self._out, self._err)
        self.pid = self._run.pid

    @property
    def returncode(self):
        return self._run.poll()

    def poll(self):
        return self._run.poll()

    def wait(self, timeout=None):
        return self._run.wait(timeout)

    def send_signal(self, sig):
        os.kill(self.pid, sig)

    def communicate(self, timeout=None):
        self._run.wait(timeout)
        output = self._out.read_text(errors="replace"), self._err.read_text(errors="replace")
        if self._own:
            self._own.cleanup()
        return output


def _start_forked_with(setup, argv, env, log: Path, errors: Path) -> here.ForkedRun:
    """`here.start_forked`, with `setup()` run in the child before the CLI."""
    from rlsmoke.engine import procs

    ctx = procs.RankContext()
    ctx.set_forkserver_preload(
        [procs.SERVER_SETUP, *procs.preloadable((*procs.HEAVY_MODULES, *here.PRELOAD))]
    )
    ready_r, ready_w = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_setup_then_main, args=(setup, list(argv[3:]), env, str(log), str(errors), ready_w)
    )
    process.start()
    ready_w.close()
    try:
        ready_r.recv()
    except EOFError:
        pass
    ready_r.close()
    return here.ForkedRun(process)


def _setup_then_main(setup, *args) -> None:
    setup()
    here._forked_main(*args)


def limit_file_size(limit: int) -> None:
    """RLIMIT_FSIZE at `limit` bytes; a write past it fails with EFBIG instead of raising SIGXFSZ."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def first_on_path(folder: str) -> None:
    """`folder` first on sys.path, as PYTHONPATH puts it for a fresh interpreter; refused when one of its
    modules is imported already (the fork server's), since the folder could then change nothing."""
    import sys

    taken = [p.stem for p in Path(folder).iterdir() if p.stem in sys.modules]
    assert not taken, f"imported before {folder} went on the path: {taken}"
    sys.path.insert(0, folder)
