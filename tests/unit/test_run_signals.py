"""An async run (Ray actors) interrupted at any moment: SIGTERM exits 143, SIGINT 130, run.log ends with
"interrupted", and no process of the run outlives it by more than 5 s.

One run per moment: while torch loads (before Ray), while Ray's cluster starts (the raylet's agents
are coming up; once per signal), while the actors load the model (the run waits on them, as it does
between rollouts). The processes checked are
every descendant seen until the signal, and every process of their sessions: the Ray cluster runs in
a session of its own, so a process it starts late is caught too.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import ForkedCli, alive, descendants, stat_fields

CASE = "glm5-744b-a40b-4layer"
OUTLIVE_S = 5.0
# the raylet's agents, as they start (python .../agent.py) and once retitled (ray::DashboardAgent)
AGENT = re.compile(r"^(ray::\w*Agent|\S*python\S* .*(dashboard/agent\.py|runtime_env/agent/main\.py))")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _live_in_sessions(sids: set[int]) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat.parent.name)
        except OSError:
            continue
        if int(fields[3]) in sids and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _moment_reached(moment: str, out: Path, seen: dict[int, str]) -> bool:
    if moment == "torch loading":  # --out is made after validation, just before torch is imported
        return out.is_dir()
    if moment == "ray starting":
        return any(AGENT.match(cmd) for cmd in seen.values())
    return any(cmd.startswith(("ray::TrainWorker", "ray::RolloutWorker")) for cmd in seen.values())


# SIGTERM while the actors load: Ray's wait re-raises it as a bare KeyboardInterrupt, which must not read as SIGINT
# SIGHUP (the terminal closed) and SIGQUIT end the run as SIGTERM does: 129 and 131, everything stopped. They
# take SIGTERM's handler (`signals.STOP`), so they are sent while Ray starts (3 s), not once the actors load (12 s).
@pytest.mark.parametrize("moment, sig", [("torch loading", signal.SIGINT), ("ray starting", signal.SIGINT),
                                         ("ray starting", signal.SIGTERM), ("actors loading", signal.SIGTERM),
                                         ("ray starting", signal.SIGHUP), ("ray starting", signal.SIGQUIT)])  # fmt: skip
def test_an_interrupted_async_run_stops_every_process_and_says_interrupted(tmp_path, moment, sig):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--mode", "async", "--num-gpus", "2",
            "--num-rollout", "8", "--out", str(out)]  # fmt: skip
    if moment == "torch loading":  # the import's moment needs a fresh interpreter
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    else:  # the same run from the CLI's first line, forked with the engine imported
        proc = ForkedCli(argv, tmp_path / "io")
    seen: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while not _moment_reached(moment, out, seen):
            seen |= {pid: _cmdline(pid) or seen.get(pid, "") for pid in descendants(proc.pid)}
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the async run never reached {moment}"
            time.sleep(0.05)
        if moment == "torch loading":
            time.sleep(0.5)
        seen |= {pid: _cmdline(pid) or seen.get(pid, "") for pid in descendants(proc.pid)}
        sessions = {proc.pid} | {int(stat_fields(pid)[3]) for pid in seen if alive(pid)}
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.monotonic()
    assert proc.returncode == 128 + sig, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr and "Fatal Python error" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith(f"error: interrupted by {sig.name}"), stderr[-3000:]
    last = (out / "run.log").read_text().splitlines()[-1]
    assert last.split("] ", 1)[1].startswith(f"interrupted by {sig.name}"), last
    said = [line for line in (out / "run.log").read_text().splitlines() if "interrupted by" in line]
    assert len(said) == 1, said  # the signal received, named once
    if moment != "torch loading":
        assert any("raylet" in cmd or "gcs_server" in cmd for cmd in seen.values()), "no Ray process was seen"
    while time.monotonic() < ended + OUTLIVE_S:
        left = [pid for pid in seen if alive(pid)] + _live_in_sessions(sessions)
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"outlived the run by {OUTLIVE_S} s: {[_cmdline(pid)[:120] for pid in left]}"
    # Ray's temp folder (session_*, sockets, logs) went with the cluster
    temp_dirs = {
        m.group(1) for cmd in seen.values() for m in [re.search(r"(/\S*/rlsmoke-ray-[^/\s]+)/", cmd)] if m
    }
    assert not [d for d in temp_dirs if Path(d).exists()], temp_dirs


def _ranks_at_work(tmp_path: Path, out: Path, ranks: int) -> ForkedCli:
    """A long tiny run of `ranks` CPU ranks, returned once they have started and worked a second."""
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--num-gpus", str(ranks),
            "--tiny", "--repeat", "50", "--records-only", "--out", str(out)]  # fmt: skip
    proc = ForkedCli(argv, tmp_path / "io")
    try:
        deadline = time.monotonic() + 240
        while len(descendants(proc.pid)) < ranks or not (out / "run.log").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.05)
        time.sleep(1.0)  # the ranks at work
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc


def test_signals_ctrl_c_on_a_run_of_several_ranks_is_one_line_without_a_rank_s_traceback(tmp_path):
    """A terminal's Ctrl-C reaches the driver and its ranks alike: the driver stops the run, the ranks
    end without a word, run.log names the signal once."""
    out = tmp_path / "out"
    proc = _ranks_at_work(tmp_path, out, ranks=4)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # the whole foreground group, as a terminal sends it
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    said = [line for line in (out / "run.log").read_text().splitlines() if "interrupted by" in line]
    assert len(said) == 1 and "interrupted by SIGINT" in said[0], said


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGKILL])
def test_a_run_of_ranks_signalled_alone_leaves_no_process_behind(tmp_path, sig):
    """The terminal closing (SIGHUP) or SIGQUIT stops the run as SIGTERM does (128 + N, run.log says so);
    SIGKILL cannot be handled, but the ranks, the fork server and its resource tracker die with the run
    (the parent-death signal) instead of running on."""
    out = tmp_path / "out"
    proc = _ranks_at_work(tmp_path, out, ranks=2)
    try:
        seen = descendants(proc.pid)
        assert len(seen) >= 2, seen
        proc.send_signal(sig)  # the driver alone: nothing else is told
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ended = time.monotonic()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + sig, (proc.returncode, stderr[-3000:])
        assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith(
            f"error: interrupted by {sig.name}"
        )
        last = (out / "run.log").read_text().splitlines()[-1]
        assert last.split("] ", 1)[1].startswith(f"interrupted by {sig.name}"), last
    while time.monotonic() < ended + OUTLIVE_S and [pid for pid in seen if alive(pid)]:
        time.sleep(0.1)
    assert not [pid for pid in seen if alive(pid)], [_cmdline(pid)[:120] for pid in seen if alive(pid)]


# A rank whose SIGINT lands inside a weakref callback: the handler's SystemExit is raised there.
IN_A_CALLBACK = """
import gc, os, signal, sys, weakref
from rlsmoke.engine import signals
signals.in_rank()
if sys.argv[1] == "default-hook":
    sys.unraisablehook = sys.__unraisablehook__
class Key: pass
def callback(_):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10000):  # the handler runs between these bytecodes, inside the callback
        pass
key = Key()
ref = weakref.ref(key, callback)
del key
gc.collect()
print("the rank went on")
"""


@pytest.mark.parametrize("hook", ["rank-hook", "default-hook"], ids=["rank", "twin-default-hook"])
def test_a_rank_interrupted_inside_a_weakref_callback_ends_quietly(hook):
    """Python prints an exception raised in a finalizer or weakref callback as "Exception ignored", with
    a traceback, and goes on; a rank ends there with 130 and says nothing. The twin, with Python's own
    hook back, prints the traceback and runs on."""
    done = subprocess.run(
        [sys.executable, "-c", IN_A_CALLBACK, hook], capture_output=True, text=True, timeout=60
    )
    if hook == "rank-hook":
        assert (done.returncode, done.stdout, done.stderr) == (128 + signal.SIGINT, "", ""), done
    else:
        assert done.returncode == 0 and "the rank went on" in done.stdout, done
        assert "Exception ignored" in done.stderr and "Traceback" in done.stderr, done
