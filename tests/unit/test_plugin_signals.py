"""Stop signals through a whole pytest session: what the plugin does on SIGTERM, what a forked child
inherits, and CI's per-test limit."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive

pytest_plugins = ["pytester"]


LONG_RUN = """
    import sys
    from pathlib import Path

    from rlsmoke.processes import runner

    def test_a_long_run(tmp_path):
        run = runner.Process([sys.executable, "-c", "import time; time.sleep(300)"], env=runner.clean_env(),
                             log=tmp_path / "run.log")
        Path("run.pid").write_text(str(run.proc.pid))
        run.wait(300)
"""


A_FORKED_CHILD = """
    import multiprocessing
    import os
    import signal
    import time

    def report_sigterm_handler(conn):
        conn.send(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)

    def test_a_forked_child_starts_with_sigterm_s_default():
        parent, child_end = multiprocessing.Pipe()
        child = multiprocessing.get_context("fork").Process(target=report_sigterm_handler, args=(child_end,))
        child.start()
        assert parent.recv() is True
        child.join(20)

    def test_a_forked_child_ends_on_sigterm():
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGTERM)
        child.join(20)
        assert child.exitcode == -signal.SIGTERM
"""


def test_a_process_forked_from_the_session_keeps_sigterm_s_default(isolated):
    """A multiprocessing pool's worker, forked from the session, inherits its SIGTERM handler. Raising
    there instead of ending left a pool's `terminate` waiting on a lock its dead sibling held; and a
    handler that ends the process is not enough, since a SIGTERM that lands just before the worker's
    blocking wait is never acted on (the suite hung in test_plugin_lease both ways). The fork starts
    with the default, so the kernel ends it whatever it is doing."""
    isolated.makepyfile(test_fork=A_FORKED_CHILD)
    result = isolated.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2)


A_HUNG_CHILD = """
    import multiprocessing
    import time
    from pathlib import Path

    def test_a_child_that_never_ends():
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,), daemon=True)
        child.start()
        Path("child.pid").write_text(str(child.pid))
        child.join()
"""


LIMIT_S = 2  # past it, a test that hangs has been seen hanging


@pytest.mark.parametrize(
    "limit, outcome", [(str(LIMIT_S), "failed"), ("0", None)], ids=["ci-limit", "no-limit"]
)
def test_ci_s_test_limit_turns_a_hang_into_a_failure_with_its_stack(isolated, monkeypatch, limit, outcome):
    """.ci/run sets PYTEST_TIMEOUT: a test that hangs joining a child (as test_plugin_lease once did) fails
    with where it waited, and the session goes on. Twin: without a limit the same test is still waiting."""
    pytest.importorskip("pytest_timeout")
    assert "\nexport PYTEST_TIMEOUT=" in (Path(__file__).parents[2] / ".ci/run").read_text()
    monkeypatch.setenv("PYTEST_TIMEOUT", limit)
    isolated.makepyfile(test_hang=A_HUNG_CHILD)
    pid_file = isolated.path / "child.pid"
    session = None
    try:
        if outcome:
            result = isolated.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
            result.assert_outcomes(failed=1)
            result.stdout.fnmatch_lines([">*child.join()", f"*Timeout (>{LIMIT_S}.0s)*"])
        else:
            argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
            session = subprocess.Popen(
                argv, cwd=isolated.path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
            deadline = time.monotonic() + 120
            while not pid_file.exists() and session.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pid_file.exists(), "the hanging test never started"
            # past the limit from the moment the test waits, not from the session's start
            with pytest.raises(subprocess.TimeoutExpired):
                session.wait(timeout=LIMIT_S + 1)
    finally:
        if session is not None and session.poll() is None:
            session.kill()
            session.wait()
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the twin's child, which this test started


@pytest.mark.parametrize("plugin, sends, ended", [("rlsmoke", 1, True), ("rlsmoke", 2, True), ("no:rlsmoke", 1, False)],
                         ids=["plugin", "plugin-twice", "no-plugin"])  # fmt: skip
def test_sigterm_to_the_session_ends_the_runs_it_launched(isolated, plugin, sends, ended):
    """A CI job's timeout sends SIGTERM: the run (a session of its own) must not outlive pytest and keep
    its GPU for the next job. coreutils' `timeout` sends it twice (to pytest, then to its group): the
    second must not cut the teardown short. Twin: without the plugin the default SIGTERM kills pytest alone."""
    isolated.makepyfile(test_long=LONG_RUN)
    args = ["-p", plugin] if plugin.startswith("no:") else []
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "test_long.py"],
                               cwd=isolated.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    pid_file = isolated.path / "run.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() and session.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), session.communicate(timeout=30)[0]
    run_pid = int(pid_file.read_text())
    time.sleep(1)  # into the wait
    for _ in range(sends):
        session.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the handler has run: a repeat sent at once would merge into the first
    output = session.communicate(timeout=60)[0]
    try:
        assert alive(run_pid) is not ended, output
        if ended:
            assert session.returncode == pytest.ExitCode.INTERRUPTED, output
    finally:
        if alive(run_pid):
            os.kill(run_pid, signal.SIGKILL)  # the twin's run, which this test started
