"""The runner with real processes: env, tee, exit codes, and timeouts that leave zero orphans."""

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import alive

from rlsmoke.processes import runner

PY = sys.executable

# A tree: the leader forks two children; one of them forks a grandchild that calls setsid (as a
# daemon would, escaping the process group); one child ignores SIGTERM. Every pid goes to a file.
TREE = textwrap.dedent("""
    import os, signal, sys, time
    pids = sys.argv[1]
    def note():
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\\n")
    note()
    for i in range(2):
        if os.fork() == 0:
            note()
            if i == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            else:
                if os.fork() == 0:
                    os.setsid()
                    note()
                    time.sleep(600)
                    os._exit(0)
            time.sleep(600)
            os._exit(0)
    print("tree started", flush=True)
    time.sleep(600)
""")


def test_timeout_kills_the_whole_tree_and_leaves_zero_orphans(tmp_path):
    pids_file = tmp_path / "pids"
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    proc = runner.Process(
        [PY, str(script), str(pids_file)], env=runner.clean_env(), log=tmp_path / "run.log", grace=1.0
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(_read(pids_file)) < 4:
        time.sleep(0.05)
    assert len(_read(pids_file)) == 4, "the tree did not start"
    result = proc.wait(timeout=0.5)
    pids = _read(pids_file)
    orphans = [p for p in pids if alive(p)]
    assert result.timed_out and result.returncode is None
    assert orphans == [], f"{len(orphans)} orphans of {len(pids)} processes: {orphans}"
    assert runner.tree_pids(proc.token, proc.proc.pid) == []
    log = (tmp_path / "run.log").read_text()
    assert "tree started" in log and "timed out after" in log


def _read(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_children_left_by_a_finished_leader_are_stopped(tmp_path):
    """A leader that exits 0 but leaves a background child: the run still ends with nothing running."""
    pid_file = tmp_path / "child"
    code = f"import subprocess, sys; p = subprocess.Popen(['sleep', '600']); open({str(pid_file)!r}, 'w').write(str(p.pid))"
    result = runner.run([PY, "-c", code], env=runner.clean_env(), log=tmp_path / "run.log", timeout=30)
    assert result.ok
    assert not alive(int(pid_file.read_text()))


@pytest.mark.parametrize(
    ("code", "rc"), [("pass", 0), ("raise SystemExit(3)", 3), ("import os; os.kill(os.getpid(), 9)", -9)]
)
def test_exit_codes_pass_through(tmp_path, code, rc):
    result = runner.run([PY, "-c", code], env=runner.clean_env(), log=tmp_path / "run.log", timeout=30)
    assert result.returncode == rc and not result.timed_out and result.ok is (rc == 0)


def test_output_goes_to_the_log(tmp_path):
    code = "import sys; print('out line'); print('err line', file=sys.stderr)"
    runner.run([PY, "-c", code], env=runner.clean_env(), log=tmp_path / "a" / "run.log", timeout=30)
    log = (tmp_path / "a" / "run.log").read_text()
    assert "out line" in log and "err line" in log and log.startswith("$ ")


def test_env_has_no_proxy_and_the_plan_env(tmp_path, monkeypatch):
    for name, value in {"PATH": "/usr/bin", "HTTPS_PROXY": "http://proxy:3128", "http_proxy": "http://proxy:3128",
                        "no_proxy": "example"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    env = runner.clean_env({"MASTER_ADDR": "127.0.0.1", "ALL_PROXY": "socks://x"})
    assert not {k for k in env if k.lower().endswith("_proxy") and k.lower() != "no_proxy"}
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["no_proxy"] == "example"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(PY).parent)
    code = "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if 'proxy' in k.lower() or k == 'MASTER_ADDR'}))"
    runner.run([PY, "-c", code], env=env, log=tmp_path / "run.log", timeout=30)
    assert '"MASTER_ADDR": "127.0.0.1"' in (tmp_path / "run.log").read_text()
    assert "proxy:3128" not in (tmp_path / "run.log").read_text()


def test_own_session(tmp_path):
    code = "import os; print('SID', os.getsid(0), os.getpid())"
    runner.run([PY, "-c", code], env=runner.clean_env(), log=tmp_path / "run.log", timeout=30)
    line = next(x for x in (tmp_path / "run.log").read_text().splitlines() if x.startswith("SID"))
    _, sid, pid = line.split()
    assert sid == pid != str(os.getsid(0))


def test_job_submit_points_at_the_leased_dashboard():
    argv = ["ray", "job", "submit", "--address", "http://127.0.0.1:8265", "--", "python3", "train.py"]
    assert runner.job_submit_argv(argv, 21001)[4] == "http://127.0.0.1:21001"


def test_a_sigterm_ignoring_process_is_killed(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    proc = runner.Process([PY, "-c", code], env=runner.clean_env(), log=tmp_path / "run.log")
    time.sleep(0.5)
    t0 = time.monotonic()
    runner.stop_tree(proc.proc, proc.token, grace=0.5)
    assert proc.proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 10
    proc.stop()


def test_a_run_here_given_os_environ_itself_runs_under_it_not_under_nothing(tmp_path, monkeypatch):
    """`run_here(argv, env=os.environ)`: the run's environment is set by clearing os.environ first, so a
    mapping that is os.environ must be copied before (an empty one started the fork server without
    PYTHONPATH, whose forked runs then imported another checkout's rlsmoke and exited 1)."""
    from rlsmoke.processes import here

    seen = {}
    monkeypatch.setattr(here, "_exit_code", lambda args: seen.update(os.environ) or 0)
    before = dict(os.environ)
    argv = [sys.executable, "-m", "rlsmoke.cli", "cases"]
    result = here.run_here(argv, env=os.environ, log=tmp_path / "log", timeout=None)
    assert result.returncode == 0 and seen == before
    assert dict(os.environ) == before


def _forked_as(wrapper: str, bad_fork: bool) -> None:
    """In the forked run, before the CLI: torch's bad-fork mark as a fork of a server that had started CUDA
    finds it, and `sys.executable` a wrapper that leaves a file behind, so the test sees an exec."""
    import torch

    torch.cuda._is_in_bad_fork = lambda: bad_fork
    sys.executable = wrapper


@pytest.mark.parametrize(
    "bad_fork", [True, False], ids=["driver-inherited-execs-fresh", "twin-clean-fork-in-place"]
)
def test_a_forked_run_that_inherits_a_gpu_driver_execs_a_fresh_interpreter(tmp_path, bad_fork):
    """A GPU run forked from a server that had started a GPU driver could not use the GPU: it runs in a fresh
    interpreter instead, with the same output and exit code, and says so. Twin: a clean fork runs in place."""
    import functools

    from procs import ForkedCli

    marker, wrapper = tmp_path / "execd", tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\ntouch {marker}\nexec {PY} "$@"\n')
    wrapper.chmod(0o755)
    setup = functools.partial(_forked_as, str(wrapper), bad_fork)
    run = ForkedCli([PY, "-m", "rlsmoke.cli", "cases"], tmp_path / "io", setup=setup)
    out, err = run.communicate(120)
    assert run.returncode == 0 and "glm5-744b-a40b-4layer " in out, err
    assert marker.exists() is bad_fork
    assert ("a fresh interpreter runs this" in err) is bad_fork
