"""Plain pytest behaves as pytest does with the rlsmoke plugin loaded: real pytest processes on small
generated suites.

A case: a suite of three files, one that declares a run and one that waits on processes it starts.
A run: `pytest` as a user types it, serial or under `-n 2`.
Gates: files in path order, `-x` stops at the first failure, `-W error::UserWarning` applies to
every test, `breakpoint()` stops in the test, `--durations` counts a declared run in its test, and
Ctrl-C leaves no process, no `pymp-*` folder and no Ray `session_*` folder 5 s later.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from procs import alive, descendants, stat_fields

OUTLIVE_S = 5.0
INI = textwrap.dedent("""
    [pytest]
    addopts = --strict-markers -ra -p no:cacheprovider -p no:randomly
    markers =
        background: a module that mostly waits on processes it starts
""")
DECLARES = textwrap.dedent("""
    from rlsmoke.cases import Case

    CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)


    def test_declares_a_run(case_record):
        assert case_record.keys()
""")
# A module marked as one that waits on processes: the plugin once ran such modules in a second session,
# which reordered them, lost options and ran them in another process.
WAITS = "import pytest\n\npytestmark = pytest.mark.background\n\n"


def _suite(folder: Path, **files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pytest.ini").write_text(INI)
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def _pytest(
    folder: Path, *args: str, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=folder, env=env or _env(folder),
                            capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert "rlsmoke: launcher=" in result.stdout, result.stdout + result.stderr  # the plugin was loaded
    return result


def _env(folder: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RLSMOKE_RUN_SERVER"))}
    return {**env, "RLSMOKE_LEASE_DIR": str(folder / "leases"), **extra}


def test_collect_only_lists_the_files_in_path_order(tmp_path):
    folder = _suite(tmp_path, test_a_declares=DECLARES, test_b_plain="def test_b():\n    pass\n",
                    test_c_waits=WAITS + "def test_c():\n    pass\n")  # fmt: skip
    result = _pytest(folder, "--collect-only")
    listed = [line.strip()[len("<Module ") : -1] for line in result.stdout.splitlines() if "<Module " in line]
    assert listed == ["test_a_declares.py", "test_b_plain.py", "test_c_waits.py"], result.stdout


def test_x_stops_at_the_first_failure(tmp_path):
    folder = _suite(tmp_path, test_a_waits=WAITS + "def test_fails():\n    assert 1 == 2\n",
                    test_b_plain="def test_b1():\n    pass\n\ndef test_b2():\n    pass\n")  # fmt: skip
    result = _pytest(folder, "-x")
    assert result.returncode == 1, result.stdout
    assert "1 failed in" in result.stdout and "passed" not in result.stdout.splitlines()[-1], result.stdout


def test_w_error_turns_a_warning_into_a_failure_in_every_test(tmp_path):
    warns = WAITS + "import warnings\n\ndef test_warns():\n    warnings.warn('seen', UserWarning)\n"
    folder = _suite(tmp_path, test_a_warns=warns, test_b_plain="def test_b():\n    pass\n")
    result = _pytest(folder, "-W", "error::UserWarning")
    assert result.returncode == 1 and "1 failed, 1 passed" in result.stdout, result.stdout
    assert "UserWarning: seen" in result.stdout, result.stdout


def test_breakpoint_stops_in_the_test_and_continues(tmp_path):
    stops = WAITS + "def test_stops():\n    here = 'in the test'\n    breakpoint()\n    assert here\n"
    folder = _suite(tmp_path, test_a_stops=stops, test_b_plain="def test_b():\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "pytest"], cwd=folder, env=_env(folder), capture_output=True,
                            text=True, timeout=120, input="p here + ', said pdb'\ncontinue\n")  # fmt: skip
    assert "in the test, said pdb" in result.stdout and "2 passed" in result.stdout, (
        result.stdout + result.stderr
    )


def test_durations_count_a_declared_run_in_its_own_test(tmp_path):
    folder = _suite(tmp_path, test_a_declares=DECLARES, test_b_plain="def test_b():\n    pass\n")
    result = _pytest(folder, "--durations=0", "--durations-min=0")
    assert result.returncode == 0, result.stdout
    timed = [line for line in result.stdout.splitlines() if "s " in line and "::test_" in line]
    run = next(line for line in timed if "test_declares_a_run" in line)
    assert float(run.split("s ", 1)[0]) > 0.3, run  # the run, started by its fixture (setup)
    others = [line for line in timed if "test_b" in line]
    assert all(float(line.split("s ", 1)[0]) < 0.3 for line in others), timed  # not in the next test


# A run of two ranks on Ray (its cluster in a session of its own), and one that only waits.
RAY_RUN = textwrap.dedent("""
    from rlsmoke.cases import Case

    CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True, num_gpus=2, mode="async")


    def test_a_ray_run(case_record):
        assert case_record.keys()
""")
SLEEPS = WAITS + "import time\n\ndef test_sleeps():\n    time.sleep(600)\n"
# Ranks in the pytest process, as megatron's tests start them: multiprocessing's fork server and its
# pymp-* folder stay for the rest of the session.
RANKS = textwrap.dedent("""
    import multiprocessing


    def test_ranks():
        ctx = multiprocessing.get_context("forkserver")
        rank = ctx.Process(target=print, args=("rank",))
        rank.start()
        rank.join()
        assert rank.exitcode == 0
""")


def _probe_pids(probe: bytes) -> set[int]:
    found = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if probe in (entry / "environ").read_bytes().split(b"\0") and alive(entry.name):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _leftovers(tmp: Path) -> list[str]:
    return sorted(
        str(p.relative_to(tmp)) for pattern in ("**/pymp-*", "**/session_*") for p in tmp.glob(pattern)
    )


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_ctrl_c_leaves_no_process_and_no_temporary_folder(tmp_path, args):
    """SIGINT to the pytest process group, as a terminal sends it, once Ray's session folder exists."""
    pytest.importorskip("ray")
    if args:
        pytest.importorskip("xdist")
    # every temporary folder of the session and its runs (pymp-*, Ray's, the server's); short, as Ray's
    # unix socket paths must be
    tmp = Path(tempfile.mkdtemp(prefix="rlb", dir="/tmp"))
    try:
        _interrupt(tmp, tmp_path, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _as_a_terminal_starts_it() -> None:
    """SIGINT at its default, as in a shell at a terminal: this session may run where it is ignored (a
    background job of a shell without job control, as CI may start it), which pytest would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(tmp: Path, tmp_path: Path, args) -> None:
    probe = f"RLSMOKE_BEHAVIOUR_PROBE={uuid.uuid4().hex}"
    folder = _suite(tmp_path / "suite", test_a_ranks=RANKS, test_b_ray=RAY_RUN, test_c_sleeps=SLEEPS)
    env = _env(folder, TMPDIR=str(tmp), **dict([probe.split("=")]))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=_as_a_terminal_starts_it)  # fmt: skip
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not list(tmp.glob("**/session_*")):
            seen |= descendants(proc.pid) | _probe_pids(probe.encode())
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "Ray's session folder never appeared"
            time.sleep(0.1)
        time.sleep(1.0)  # the cluster's processes up, the sleeping test started
        seen |= descendants(proc.pid) | _probe_pids(probe.encode())
        sessions = {proc.pid} | {int(stat_fields(pid)[3]) for pid in seen if alive(pid)}
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.monotonic()
    assert proc.returncode in (2, 1), out[-3000:]  # pytest's "interrupted" (xdist: its controller's)
    while True:
        left = {pid for pid in seen | _probe_pids(probe.encode()) if alive(pid)}
        left |= {int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat")
                 if _in_sessions(stat.parent.name, sessions)}  # fmt: skip
        if (not left and not _leftovers(tmp)) or time.monotonic() > ended + OUTLIVE_S:
            break
        time.sleep(0.2)
    assert not left, f"outlived pytest by {OUTLIVE_S} s: {sorted(left)}\n{out[-3000:]}"
    assert not _leftovers(tmp), f"left behind: {_leftovers(tmp)}\n{out[-3000:]}"


def _in_sessions(pid: str, sessions: set[int]) -> bool:
    try:
        fields = stat_fields(pid)
    except OSError:
        return False
    return int(fields[3]) in sessions and fields[0] != "Z"
