"""Runs that go ahead of their tests (`rlsmoke.run_ahead`), through pytester, and the lane that runs them.

A case: tiny GLM-5 on CPU, declared by three tests in an inner session that may run one ahead.
A run: the session; the second test changes its environment after its run went ahead.
Gates: the third test's run went ahead and was claimed; the second's was stopped and launched again,
and says so in its log; a test that will be skipped never starts a run. The lane keeps its order,
kills a run at its timeout, and starts a run early only on an idle core or the one its last run
left. Tests marked background run in a second session and report last, as if they ran here.
"""

import json
import re
import sys
import textwrap
import time

import pytest

from rlsmoke.launch.runner import clean_env
from rlsmoke.run_ahead import Lane

pytest_plugins = ["pytester"]

DECLARED = """
import pytest
from rlsmoke.cases import Case
from rlsmoke.suite import CaseRun, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)


def test_in_front(case_record):
    gates_for(CASE).check(case_record)


@pytest.fixture
def another_environment(monkeypatch):
    monkeypatch.setenv("RLSMOKE_RUN_AHEAD_PROBE", "set by the test")


def test_changes_its_environment(another_environment, case_record, artifacts):
    log = (artifacts / "pytest-run.log").read_text()
    assert "the run started ahead had another environment (RLSMOKE_RUN_AHEAD_PROBE)" in log
    gates_for(CASE).check(case_record)


@pytest.mark.parametrize("case_record", [CaseRun(CASE, seed=1)], indirect=True)
def test_goes_ahead(case_record, artifacts):
    assert case_record.meta["seed"] == 1
    assert "started ahead" not in (artifacts / "pytest-run.log").read_text()
    gates_for(CASE).check(case_record)
"""


@pytest.fixture
def inner(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.delenv("NUM_GPUS", raising=False)
    pytester.makeini("[pytest]\naddopts = --strict-markers -ra\n")
    return pytester


@pytest.mark.slow
def test_a_run_goes_ahead_and_is_claimed_only_if_the_test_would_launch_the_same(inner):
    inner.makepyfile(test_declared=DECLARED)
    result = inner.runpytest("--run-ahead", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["rlsmoke: case runs started ahead of their tests and claimed: 1 *"])


def test_a_test_that_will_be_skipped_starts_no_run(inner):
    """What the first test sees handed to the lane: the declared run, not the two that will skip."""
    inner.makepyfile(test_skipped=textwrap.dedent("""
        import pytest
        from rlsmoke.cases import Case
        from rlsmoke.errors import RlsmokeError
        from rlsmoke.pytest_plugin import _AHEAD
        from rlsmoke.suite import CaseRun

        CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)


        def test_in_front(request):
            print("SUBMITTED", sorted(request.config.stash[_AHEAD].submitted))


        @pytest.mark.skip(reason="not today")
        def test_skipped(case_record):
            pass


        @pytest.mark.skipif("True", reason="not here")
        def test_skipped_if(case_record):
            pass


        @pytest.mark.xfail(raises=RlsmokeError, strict=True, reason="the CLI refuses the fault, at once")
        @pytest.mark.parametrize("case_record", [CaseRun(CASE, inject="no-such-fault")], indirect=True)
        def test_declared(case_record):
            pass
    """))
    result = inner.runpytest("--run-ahead", "1", "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert "SUBMITTED ['test_skipped.py::test_declared[case_record0]']\n" in result.stdout.str()


@pytest.mark.parametrize(("run_ahead", "order"), [
    ("2", ["test_a_first.py::test_a", "test_c_waits.py::test_c", "test_d_skips.py::test_d",
           "test_b_declares.py::test_b1", "test_b_declares.py::test_b2"]),
    ("0", ["test_a_first.py::test_a", "test_b_declares.py::test_b1", "test_b_declares.py::test_b2",
           "test_c_waits.py::test_c", "test_d_skips.py::test_d"]),
], ids=["ahead", "off"])  # fmt: skip
def test_modules_that_declare_runs_go_last_and_keep_their_order(inner, run_ahead, order):
    """Their runs then fill the cores the others leave idle. A module whose declared run will skip
    stays; `--run-ahead 0` keeps pytest's order."""
    case = 'from rlsmoke.cases import Case\nCASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)\n'
    inner.makepyfile(test_a_first="def test_a():\n    pass\n",
                     test_b_declares=case + "def test_b1(case_record):\n    pass\ndef test_b2():\n    pass\n",
                     test_c_waits="def test_c():\n    pass\n",
                     test_d_skips="import pytest\n" + case + "@pytest.mark.skip(reason='not today')\n"
                                  "def test_d(case_record):\n    pass\n")  # fmt: skip
    result = inner.runpytest("--run-ahead", run_ahead, "-p", "no:cacheprovider", "--co", "-q")
    assert [line for line in result.stdout.lines if "::" in line] == order


def test_case_record_without_a_run_is_a_usage_error_naming_the_fix(inner):
    inner.makepyfile(test_nothing="def test_x(case_record):\n    pass\n")
    result = inner.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*uses case_record without a run: parametrize it with rlsmoke.suite.CaseRun*"])


def test_the_lane_runs_in_order_and_kills_a_run_at_its_timeout(tmp_path):
    """Slots of 1: the second run starts only once the first has ended, here at its 1 s timeout. The
    lane starts them without waiting for an idle core (the host's load is another test's subject)."""
    lane = Lane(None, 1, idle_cores=0)  # no warm server: each run starts as a fresh interpreter
    try:
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        stamp = [sys.executable, "-c", "import json, time; print(json.dumps(time.time()))"]
        lane.submit("slow", sleeper, clean_env(), tmp_path / "slow.log", timeout=1.0)
        lane.submit("quick", stamp, clean_env(), tmp_path / "quick.log", timeout=60.0)
        slow, quick = lane.wait("slow", 30), lane.wait("quick", 30)
    finally:
        lane.close()
    assert slow["timed_out"] and slow["returncode"] is None and 1.0 <= slow["seconds"] < 15
    assert "rlsmoke: timed out after 1 s" in (tmp_path / "slow.log").read_text()
    assert not quick["timed_out"] and quick["returncode"] == 0
    assert lane.proc.returncode == 0
    started = json.loads((tmp_path / "quick.log").read_text().splitlines()[-1])
    assert started >= (tmp_path / "slow.log").stat().st_mtime - 0.5  # after the first one ended


@pytest.fixture
def every_core_busy():
    """A spinning process per core, ended (by its pid) when the test ends."""
    import os
    import subprocess

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


def test_the_lane_waits_for_an_idle_core_unless_the_run_is_claimed(tmp_path, every_core_busy):
    """Every core busy: a submitted run waits; claimed, it starts."""
    lane = Lane(None, 1)
    try:
        lane.submit("run", [sys.executable, "-c", "pass"], clean_env(), tmp_path / "run.log", timeout=60.0)
        assert lane.wait("run", 1.5) is None and not (tmp_path / "run.log").exists()
        lane.claim("run")
        assert lane.wait("run", 30)["returncode"] == 0
    finally:
        lane.close()


def test_a_run_that_ends_hands_its_core_to_the_next_without_waiting_for_an_idle_one(tmp_path, every_core_busy):
    """Every core busy: the claimed run's end frees the core it ran on, and the next run starts there
    unclaimed. The twin is the test above: with no run of the lane ending, it waits."""
    lane = Lane(None, 1)
    try:
        for run in ("first", "next"):
            lane.submit(run, [sys.executable, "-c", "pass"], clean_env(), tmp_path / f"{run}.log", timeout=60.0)
        lane.claim("first")
        assert lane.wait("first", 30)["returncode"] == 0
        assert lane.wait("next", 15)["returncode"] == 0
    finally:
        lane.close()


@pytest.mark.parametrize("lane_ports", [[29001, 29002], []], ids=["leased", "none"])
def test_runs_that_overlap_in_the_lane_rendezvous_on_ports_of_their_own(tmp_path, lane_ports):
    """Two claimed runs overlap: each is given its own MASTER_PORT from the lane's ports, never the
    session's. The twin, a lane with no ports, hands both the session's, where their ranks would meet."""
    lane = Lane(None, 2, lane_ports)
    env = {**clean_env(), "MASTER_PORT": "21009"}
    show = [sys.executable, "-c", "import os, time; print(os.environ['MASTER_PORT'], flush=True); time.sleep(1)"]
    try:
        for run in ("a", "b"):
            lane.submit(run, show, env, tmp_path / f"{run}.log", timeout=60.0)
            lane.claim(run)
        assert [lane.wait(run, 30)["returncode"] for run in ("a", "b")] == [0, 0]
    finally:
        lane.close()
    seen = [(tmp_path / f"{run}.log").read_text().split()[-1] for run in ("a", "b")]
    if lane_ports:
        assert sorted(seen) == ["29001", "29002"]
    else:
        assert seen == ["21009", "21009"]


def test_the_lane_reads_what_it_is_sent_while_the_warm_server_still_imports(tmp_path):
    """The session hands the lane its first runs at once, more than a pipe holds; the lane must not
    stop reading them while it waits for the warm server (seconds of imports), or the session's first
    test waits as long. Here the server never comes: its folder is there, its socket never is."""
    import signal
    from types import SimpleNamespace

    (tmp_path / "server").mkdir()
    importing = SimpleNamespace(socket_path=str(tmp_path / "server" / "socket"))
    lane = Lane(importing, 1)

    def blocked(*_):
        raise AssertionError("writing to the lane blocked while it attached to the warm server")

    before = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(20)
    try:
        env = {**clean_env(), "PADDING": "x" * 16384}  # 16 runs of 16 KiB: four pipe buffers' worth
        for i in range(16):
            lane.submit(f"run-{i}", [sys.executable, "-c", "pass"], env, tmp_path / f"{i}.log", timeout=60.0)
        lane.cancel("run-15")  # answered from the queue, though no run can start yet
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
        lane.close()
    assert not list(tmp_path.glob("*.log")), "a run started before the warm server was there"


def _may_raise_priority() -> bool:
    import os
    import resource

    return os.geteuid() == 0 or 20 - resource.getrlimit(resource.RLIMIT_NICE)[0] <= os.getpriority(os.PRIO_PROCESS, 0)


def test_the_lane_s_runs_yield_the_cpu_to_the_test_in_front_until_it_waits_for_them(tmp_path):
    """A lane run, and what it starts, run nicer than the session; claimed, the run takes the session's
    priority back (where this user may raise one). A run the test launches itself runs at the session's."""
    import os

    from rlsmoke.launch import runner
    from rlsmoke.launch.lane import LANE_NICE

    claimed = tmp_path / "claimed"
    show = [sys.executable, "-c", textwrap.dedent(f"""
        import os, pathlib, subprocess, sys, time
        nice = lambda: os.getpriority(os.PRIO_PROCESS, 0)
        child = subprocess.check_output([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"])
        print("before", nice(), int(child), os.getpid(), flush=True)
        while not pathlib.Path({str(claimed)!r}).exists():
            time.sleep(0.05)
        print("after", nice(), flush=True)
    """)]  # fmt: skip
    own = os.getpriority(os.PRIO_PROCESS, 0)
    lane = Lane(None, 1, idle_cores=0)  # started without waiting for an idle core: its priority is the subject
    try:
        lane.submit("run", show, clean_env(), tmp_path / "lane.log", timeout=120.0)
        deadline = time.monotonic() + 120
        while not (started := [line for line in _lines(tmp_path / "lane.log") if line.startswith("before ")]):
            assert time.monotonic() < deadline, "the lane never started the run"
            time.sleep(0.05)
        lane.claim("run")
        pid, deadline = int(started[0].split()[-1]), time.monotonic() + (10 if _may_raise_priority() else 0.5)
        while os.getpriority(os.PRIO_PROCESS, pid) != own and time.monotonic() < deadline:
            time.sleep(0.05)  # the lane reads the claim within its next poll
        claimed.touch()
        assert lane.wait("run", 60)["returncode"] == 0
    finally:
        lane.close()
    said = {line.split()[0]: line.split()[1:] for line in _lines(tmp_path / "lane.log")
            if line.startswith(("before ", "after "))}  # fmt: skip
    assert said["before"][:2] == [str(own + LANE_NICE)] * 2
    assert said["after"] == [str(own if _may_raise_priority() else own + LANE_NICE)]
    runner.Process(show, env=clean_env(), log=tmp_path / "direct.log").wait(30)
    assert [line.split()[1:3] for line in _lines(tmp_path / "direct.log") if line.startswith("before ")] == [[str(own)] * 2]


def _lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


BACKGROUND = """
import os
import pytest

pytestmark = pytest.mark.background


def test_passes(record_property):
    record_property("pid", os.getpid())


def test_fails():
    assert 1 == 2, "said in the background"


def test_skips():
    pytest.skip("skipped there")
"""


@pytest.mark.parametrize("args", [(), ("--run-ahead", "0"), ("-s",)], ids=["beside", "off", "no-capture"])
def test_background_tests_run_in_a_second_session_and_report_last_as_if_here(inner, tmp_path, args):
    """The twins: --run-ahead 0, and -s (whose output a second session would hide), run them here."""
    import os
    import xml.etree.ElementTree as ET

    inner.makepyfile(test_b_wait=BACKGROUND, test_a_front="def test_front():\n    pass\n",
                     test_c_after="def test_after():\n    pass\n")  # fmt: skip
    inner.makeini("[pytest]\naddopts = --strict-markers -ra\njunit_family = xunit1\n")
    junit = tmp_path / "junit.xml"
    result = inner.runpytest("-v", f"--junitxml={junit}", *args)
    result.assert_outcomes(passed=3, failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*said in the background*"])
    order = [m.group(1) for line in result.stdout.lines if (m := re.search(r"::(test_\w+) (PASSED|FAILED|SKIPPED)", line))]
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_fails"].find("failure") is not None
    pid = int(cases["test_passes"].find("properties/property[@name='pid']").get("value"))
    beside = not args
    assert (pid != os.getpid()) == beside
    assert (inner.path / "artifacts" / "background-session.log").exists() == beside
    if beside:  # the background module's tests show after the others, in their order
        assert order == ["test_front", "test_after", "test_passes", "test_fails", "test_skips"], order


def test_a_background_session_that_dies_fails_the_tests_it_did_not_report(inner):
    inner.makepyfile(test_b_wait="""
        import os
        import pytest

        pytestmark = pytest.mark.background

        def test_reported():
            pass

        def test_ends_the_session():
            os._exit(3)

        def test_never_ran():
            pass
    """, test_a_front="def test_front():\n    pass\n")  # fmt: skip
    result = inner.runpytest_subprocess()  # should the test run here after all, it ends only that session
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*the background pytest session exited with 3 before *test_ends_the_session "
                                 "reported; its output: *background-session.log*"])  # fmt: skip
