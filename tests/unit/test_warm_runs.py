"""Warm runs (`rlsmoke.launch.warm`): a CPU run forked from the server is the run a fresh interpreter gives.

The same metrics bit for bit, the same exit codes, its own session and token, stopped by the runner
like any other tree; the server never outlives its client. CPU ranks fork from their driver only
where nothing in it can break (`rlsmoke.engine.procs.fork_is_safe`).
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import alive, in_a_child, stat_fields

from rlsmoke.errors import ExitCode
from rlsmoke.launch import runner
from rlsmoke.launch.warm import ForkedRun, WarmServer

pytest_plugins = ["pytester"]

CASE = "glm5-744b-a40b-4layer"


def _argv(out, *args):
    return [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--tiny", "--records-only",
            "--out", str(out), *args]  # fmt: skip


@pytest.fixture(scope="module")
def server(rlsmoke_run_server):
    """The session's server where it started one (it has imported by now), else this module's own."""
    if rlsmoke_run_server is not None and rlsmoke_run_server.proc is not None:
        yield rlsmoke_run_server
        return
    warm = WarmServer.start(runner.clean_env())
    yield warm
    warm.stop()


def _forked(server, tmp_path, *args, name="run") -> tuple[runner.Process, bool]:
    proc = runner.Process(_argv(tmp_path / name, *args), env=runner.clean_env(), log=tmp_path / f"{name}.log",
                          warm=server)  # fmt: skip
    return proc, isinstance(proc.proc, ForkedRun)


def test_a_forked_run_writes_what_a_fresh_interpreter_writes_and_another_seed_does_not(server, tmp_path):
    """Against a run in this process, which test_engine_run pins to a fresh interpreter's bits."""
    from rlsmoke.engine.config import RunConfig
    from rlsmoke.engine.run import execute

    proc, forked = _forked(server, tmp_path, name="warm")
    other, _ = _forked(server, tmp_path, "--seed", "1", name="seed1")
    execute(RunConfig(case=CASE, tiny=True), tmp_path / "here")
    assert forked and (proc.wait(300).returncode, other.wait(300).returncode) == (0, 0)
    metrics = (tmp_path / "here" / "metrics.jsonl").read_text()
    assert (tmp_path / "warm" / "metrics.jsonl").read_text() == metrics
    assert (tmp_path / "seed1" / "metrics.jsonl").read_text() != metrics  # the comparison can see a change


def test_a_forked_run_with_two_ranks_writes_what_one_rank_writes(server, tmp_path):
    one, _ = _forked(server, tmp_path, "--n-prompts", "2", name="one")
    two, forked = _forked(server, tmp_path, "--n-prompts", "2", "--num-gpus", "2", name="two")
    assert forked and (one.wait(300).returncode, two.wait(300).returncode) == (0, 0)
    ranks = json.loads((tmp_path / "two" / "summary.json").read_text())["placement"]["ranks"]
    assert len({r["pid"] for r in ranks}) == 2
    for a, b in zip((tmp_path / "one" / "metrics.jsonl").read_text().splitlines(),
                    (tmp_path / "two" / "metrics.jsonl").read_text().splitlines(), strict=True):  # fmt: skip
        x, y = json.loads(a), json.loads(b)
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], float):
                assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), key


def test_a_usage_error_in_a_fork_is_exit_2_with_one_error_line(server, tmp_path):
    proc, forked = _forked(server, tmp_path, "--n-samples", "0")
    result = proc.wait(60)
    errors = [line for line in result.log.read_text().splitlines() if line.startswith("error:")]
    assert forked and result.returncode == ExitCode.USAGE and len(errors) == 1, result.log.read_text()
    assert "Traceback" not in result.log.read_text()


def test_a_run_after_the_warm_server_died_starts_cold_and_its_log_says_why(tmp_path):
    """The server is killed between two runs: the second is spawned, with the same outcome."""
    warm = WarmServer.start(runner.clean_env())
    try:
        first, forked = _forked(warm, tmp_path, "--n-samples", "0", name="first")
        assert forked and first.wait(120).returncode == ExitCode.USAGE
        warm.proc.kill()
        warm.proc.wait()
        second, forked = _forked(warm, tmp_path, "--n-samples", "0", name="second")
        result = second.wait(120)
    finally:
        warm.stop()
    log = result.log.read_text()
    assert not forked and result.returncode == ExitCode.USAGE, log
    assert "rlsmoke: started cold: the warm run server did not answer" in log, log


def test_a_fork_is_its_own_session_and_sigterm_stops_it_as_it_stops_a_fresh_run(server, tmp_path):
    proc, forked = _forked(server, tmp_path, "--repeat", "50")
    pid = proc.proc.pid
    fields = stat_fields(pid)
    assert forked and int(fields[1]) == server.proc.pid and int(fields[3]) == pid  # parent, session
    run_log = tmp_path / "run" / "run.log"
    deadline = time.monotonic() + 120
    while "step 0:" not in (run_log.read_text() if run_log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)  # the run is under way
    os.kill(pid, signal.SIGTERM)
    result = proc.wait(60)
    assert result.returncode == 128 + signal.SIGTERM, result.log.read_text()
    assert "interrupted" in run_log.read_text().rstrip().splitlines()[-1]
    assert not alive(pid)  # reaped by the server, not left a zombie


@pytest.mark.parametrize("change, accepted", [
    ({}, True),
    ({"argv": ["--platform", "nvidia"]}, True),  # its fork initializes its own driver (or execs cold: below)
    ({"argv": ["--platform", "rocm"]}, False),  # HIP is mapped as torch imports and cannot be asked
    ({"env": {"OMP_NUM_THREADS": "7"}}, False),  # read when torch loads: the server loaded it at another value
    ({"env": {"PYTHONHASHSEED": "3"}}, False),
    ({"env": {"RLSMOKE_THRESHOLDS_DIR": "/elsewhere", "MASTER_PORT": "1234"}}, True),  # read at run time
    ({"env": {"PYTHONBREAKPOINT": "ray.util.rpdb.set_trace", "PYTHONUNBUFFERED": "1"}}, True),  # Ray's driver sets it
    ({"env": {"PYTHONPATH": "/elsewhere"}}, True),  # settled in the fork: see the search-path tests below
    ({"command": "-c"}, False),
    ({"command": "verify"}, True),  # the checkpoint tools never touch a GPU
    ({"command": "plan"}, False),
])  # fmt: skip
def test_the_server_forks_only_a_cpu_or_nvidia_run_under_the_variables_it_imported_with(server, change, accepted):
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", *change.get("argv", [])]
    if change.get("command") == "-c":
        argv[1:3] = ["-c", "import rlsmoke.cli"]
    elif change.get("command"):
        argv[3] = change["command"]
    if "--platform" in change.get("argv", []):
        del argv[5:7]
    env = {**runner.clean_env(), **change.get("env", {})}
    assert server.accepts(argv, env) is accepted


def _prepare(server, tmp_path, pythonpath: Path) -> tuple[runner.Process, bool]:
    argv = [sys.executable, "-m", "rlsmoke.cli", "prepare", CASE, "--tiny"]  # the cached checkpoint: quick
    # in front of the session's own PYTHONPATH (`PYTHONPATH=src pytest`: the server's rlsmoke came from there)
    search = os.pathsep.join(filter(None, [str(pythonpath), os.environ.get("PYTHONPATH")]))
    proc = runner.Process(argv, env={**runner.clean_env(), "PYTHONPATH": search},
                          log=tmp_path / f"{pythonpath.name}.log", warm=server)  # fmt: skip
    return proc, isinstance(proc.proc, ForkedRun)


def test_a_fork_under_another_pythonpath_stays_warm_unless_the_path_would_change_an_import(server, tmp_path):
    """A fresh interpreter searches PYTHONPATH first: a folder that holds a module the server imported
    (here a torch that fails), or a sitecustomize, makes the fork exec a fresh interpreter, which then
    does what a fresh one does."""
    for name, module, code in [("plain", "unrelated_probe", "raise SystemExit('never imported')"),
                               ("shadow", "torch", "raise ImportError('the torch of a PYTHONPATH folder')"),
                               ("hook", "sitecustomize", "print('sitecustomize ran', flush=True)")]:  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{module}.py").write_text(code + "\n")

    started = {name: _prepare(server, tmp_path, tmp_path / name) for name in ("plain", "shadow", "hook")}  # at once
    (plain, forked), (shadow, shadow_forked), (hook, _) = ((p.wait(120), f) for p, f in started.values())
    assert forked and plain.returncode == 0 and "started cold" not in plain.log.read_text(), plain.log.read_text()

    log = shadow.log.read_text()
    assert shadow_forked and f"started cold: {tmp_path / 'shadow'} (cwd or PYTHONPATH) holds torch, which" in log, log
    assert shadow.returncode != 0 and "the torch of a PYTHONPATH folder" in log  # as a fresh interpreter fails

    log = hook.log.read_text()
    assert hook.returncode == 0 and "holds sitecustomize" in log and "sitecustomize ran" in log, log


def _search_path_after(conn, pythonpath):
    from rlsmoke.launch import warm

    sys.path[0] = os.getcwd()  # as in a server started by `python -m` here
    why = warm._fresh_search_path("", pythonpath)
    conn.send((why, sys.path[:3]))


def test_a_fork_searches_the_cwd_then_the_pythonpath_then_the_rest_as_python_m_does(tmp_path):
    import multiprocessing

    rest = sys.path[1:3]
    pythonpath = f"{tmp_path}{os.pathsep}{tmp_path / 'b'}"  # the rebuild changes sys.path: in a child of its own
    reply = in_a_child(multiprocessing.get_context("fork"), _search_path_after, pythonpath, timeout=30)
    assert reply == ("", [os.getcwd(), str(tmp_path), str(tmp_path / "b")])
    assert sys.path[1:3] == rest  # this process's own is untouched


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """The client dies without a word, importing or serving: the server exits within seconds."""
    script = ("import sys, os; from rlsmoke.launch.warm import WarmServer; s = WarmServer.start(); "
              "print(s.proc.pid, s.socket_path, flush=True); os._exit(0)")  # fmt: skip
    client = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    pid, socket_path = client.stdout.split()
    deadline = time.monotonic() + 10
    while (alive(pid) or os.path.exists(os.path.dirname(socket_path))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)
    assert not os.path.exists(os.path.dirname(socket_path)), "the server left its socket folder behind"


def test_ranks_fork_from_their_driver_only_where_nothing_can_break(monkeypatch):
    import torch

    from rlsmoke.engine import procs
    from rlsmoke.engine.procs import fork_is_safe, rank_context

    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread()])  # this session's own aside
    monkeypatch.setattr(procs, "_native_thread_names", lambda: ["python"])  # the rule alone, row by row
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert fork_is_safe() and rank_context(cpu_only=True).get_start_method() == "fork"
    assert rank_context(cpu_only=False).get_start_method() == "forkserver"  # ranks on GPUs
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # a group the ranks would inherit
    assert not fork_is_safe() and rank_context(cpu_only=True).get_start_method() == "forkserver"
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # an OpenMP team a fork would copy half-way
    assert not fork_is_safe() and rank_context(cpu_only=True).get_start_method() == "forkserver"
    monkeypatch.undo()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(procs, "_native_thread_names", lambda: ["python"])
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not fork_is_safe()  # a thread that may hold a lock the fork would copy held
    finally:
        stop.set()
        other.join()


# CUDA's driver API as far as the fork rules ask it: a count before cuInit is CUDA_ERROR_NOT_INITIALIZED,
# and so it is in a forked child of the process that initialized it (as a fork of the H200's read).
STAND_IN_DRIVER = """
#include <unistd.h>
static pid_t initialized_in;
int cuInit(unsigned int flags) { initialized_in = getpid(); return 0; }
int cuDeviceGetCount(int *count) { if (initialized_in != getpid()) return 3; *count = 1; return 0; }
"""

ASK_THE_DRIVER = """
import ctypes, sys
from rlsmoke.engine.procs import fork_is_safe, gpu_driver_initialized
driver = ctypes.CDLL(sys.argv[1])
loaded = gpu_driver_initialized(), fork_is_safe()
driver.cuInit(0)
print(loaded, (gpu_driver_initialized(), fork_is_safe()))
"""


def test_ranks_do_not_fork_from_a_process_that_initialized_a_gpu_driver(tmp_path):
    """A CUDA build of torch maps the driver at import, which forks survive; a first
    `torch.cuda.is_available()` initializes it, and a fork's child then fails at its first GPU call. The
    rule asks the driver (its own library, compiled here, stands in for CUDA's) in a fresh process.
    Twin: the same process after cuInit does not fork."""
    library = _stand_in_driver(tmp_path)
    asked = subprocess.run([sys.executable, "-c", ASK_THE_DRIVER, library], capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.split("\n")[-2] == "(False, True) (True, False)"


def _stand_in_driver(folder: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in driver")
    (folder / "driver.c").write_text(STAND_IN_DRIVER)
    library = folder / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", library, folder / "driver.c"], check=True)
    return library


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU host: its own libcuda.so.1 is the driver")
@pytest.mark.parametrize("initialized", [False, True], ids=["driver-untouched", "driver-initialized"])
def test_a_run_forks_only_from_a_server_whose_gpu_driver_is_untouched(tmp_path, initialized):
    """On the H200 the server's imports initialized CUDA, and its forked runs, CPU ones too, then died at
    their first CUDA call ("Cannot re-initialize CUDA in forked subprocess"). Here a sitecustomize maps the
    stand-in driver into the server, as a CUDA build of torch does, and in the twin initializes it. Its
    run then execs a fresh interpreter in place and says why; the stand-in, as the H200's driver did,
    reads as uninitialized in the fork, so only the server's answer can tell. Either way the run passes."""
    library = _stand_in_driver(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    call = "driver.cuInit(0)" if initialized else "pass"
    (site / "sitecustomize.py").write_text(f"import ctypes\ndriver = ctypes.CDLL({str(library)!r})\n{call}\n")
    search = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**runner.clean_env(), "PYTHONPATH": search}
    warm = WarmServer.start(env)
    try:
        proc = runner.Process(_argv(tmp_path / "run"), env=env, log=tmp_path / "run.log", warm=warm)
        result = proc.wait(300)
    finally:
        warm.stop()
    log = result.log.read_text()
    assert isinstance(proc.proc, ForkedRun) and result.returncode == 0, log
    cold = "rlsmoke: started cold: the warm server's GPU driver is initialized: a fork could not use CUDA"
    assert (cold in log) is initialized, log


def test_where_fla_is_installed_no_fork_parent_imports_flash_s_modeling_ahead(monkeypatch):
    """transformers' GLM-5.3-Flash modeling imports fla, which asks the GPU's name as it imports: preloaded
    on the H200, it initialized CUDA in the warm server (docs/runs/2026-12-03-h200-round-15b542d). The
    warm server, the ranks' fork server and a driver forking its CPU ranks all import through `preloadable`."""
    import importlib.util

    from rlsmoke.engine import procs
    from rlsmoke.launch import warm

    flash = "transformers.models.glm5_next.modeling_glm5_next"
    found = importlib.util.find_spec
    monkeypatch.setitem(sys.modules, flash, sys.modules.get(flash) or object())  # imported by the driver
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else found(name, *a))
    assert procs.preloadable(warm.PRELOAD) == warm.PRELOAD and flash in warm.PRELOAD
    assert flash in procs.server_preload()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "fla" else found(name, *a))
    assert set(warm.PRELOAD) - set(procs.preloadable(warm.PRELOAD)) == {flash}
    assert flash not in procs.server_preload()


@pytest.mark.parametrize("users", [None, "0"], ids=["unset", "set-by-the-user"])
def test_the_warm_server_imports_with_device_counts_through_nvml_and_its_forks_do_not(monkeypatch, tmp_path, users):
    """megatron-core's import asks `torch.cuda.is_available()`; through the CUDA runtime that initialized
    the H200 server's driver (docs/runs/2026-12-03-h200-round-524e8a0/probe.txt), so every GPU run
    started cold. The server's preload asks NVML instead; the variable is gone once it has imported, so
    what it reports to an attaching session, and each fork's environment, is its caller's. A value the
    user set is theirs throughout."""
    from rlsmoke.engine.procs import NVML_DEVICE_COUNT
    from rlsmoke.launch import warm

    (tmp_path / "sees_the_switch.py").write_text(f"import os\nSEEN = os.environ.get({NVML_DEVICE_COUNT!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(warm, "PRELOAD", ("sees_the_switch",))
    if users is None:
        monkeypatch.delenv(NVML_DEVICE_COUNT, raising=False)
    else:
        monkeypatch.setenv(NVML_DEVICE_COUNT, users)
    warm._preload()
    assert sys.modules.pop("sees_the_switch").SEEN == (users or "1")
    assert os.environ.get(NVML_DEVICE_COUNT) == users
    assert warm.import_time_env(os.environ).get(NVML_DEVICE_COUNT) == users
    # the ranks' fork server sets the same switch for good (read, not imported: it would set it here)
    assert f'"{NVML_DEVICE_COUNT}"' in Path(importlib.util.find_spec("rlsmoke.engine.rank_server").origin).read_text()


def test_where_proc_cannot_list_the_libraries_only_a_gpu_build_counts_as_initialized(monkeypatch):
    """No /proc (macOS): a CPU build of torch cannot have started a driver, so the warm server's forks
    and the driver's rank forks stay on; a GPU build's cannot be asked, so they go off."""
    import torch

    from rlsmoke.engine import procs

    monkeypatch.setattr(procs, "mapped_libraries", lambda prefixes: None)
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build
    monkeypatch.setattr(torch.version, "hip", None)
    assert not procs.gpu_driver_initialized()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert procs.gpu_driver_initialized()


def test_torch_s_own_bad_fork_mark_makes_a_run_start_cold(monkeypatch):
    """The other view of the same fact: torch marks a child forked after its CUDA start."""
    import torch

    from rlsmoke.launch.warm import driver_refusal

    assert driver_refusal(False) == ""
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert "GPU driver is initialized" in driver_refusal(False)


def test_a_mapped_hip_runtime_turns_rank_forks_off(monkeypatch):
    """HIP cannot be asked without initializing it: mapped at all, ranks start from the fork server.
    On this host no GPU library is mapped; the twin names one that is (torch's own) as HIP's."""
    import torch

    from rlsmoke.engine import procs
    from rlsmoke.engine.procs import fork_is_safe, gpu_driver_initialized, mapped_libraries, rank_context

    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread()])
    monkeypatch.setattr(procs, "_native_thread_names", lambda: ["python"])
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not gpu_driver_initialized() and fork_is_safe()
    found = mapped_libraries(("libtorch_cpu.so", "libnot-loaded.so"))
    assert list(found) == ["libtorch_cpu.so"] and Path(found["libtorch_cpu.so"]).is_file()
    monkeypatch.setattr(procs, "HIP_RUNTIME", "libtorch_cpu.so")
    assert gpu_driver_initialized()
    assert not fork_is_safe() and rank_context(cpu_only=True).get_start_method() == "forkserver"


def test_a_progress_bar_leaves_no_thread_behind(capsys):
    """tqdm's monitor thread would outlive the bar, and any thread turns the rank forks of a process off."""
    from rlsmoke.checkpoints.progress import ProgressBar

    before = threading.active_count()
    with ProgressBar(10, "bytes", enabled=True) as bar:
        bar(10)
    assert threading.active_count() == before


def test_a_progress_monitor_left_by_someone_else_s_bar_does_not_turn_rank_forks_off(monkeypatch):
    """transformers' loading bars are tqdm's own: their monitor thread is stopped before a fork."""
    import torch
    from tqdm import tqdm

    from rlsmoke.engine.procs import fork_is_safe

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(tqdm, "monitor_interval", 10)
    for _ in tqdm(range(2), disable=False, file=open(os.devnull, "w")):  # noqa: SIM115
        pass
    assert any(t.name == "tqdm_monitor" for t in threading.enumerate())
    fork_is_safe()
    assert not any(t.name == "tqdm_monitor" for t in threading.enumerate())


def test_multiprocessing_s_fd_sharer_does_not_turn_rank_forks_off(monkeypatch):
    """Tensors sent over a pipe start it; multiprocessing resets it in a fork's child itself."""
    import multiprocessing
    from multiprocessing import resource_sharer

    import torch

    from rlsmoke.engine import procs
    from rlsmoke.engine.procs import fork_is_safe

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(procs, "_native_thread_names", lambda: ["python"])
    reader, writer = multiprocessing.get_context("fork").Pipe(duplex=False)
    writer.send(torch.ones(3))  # torch's reduction shares the storage's fd through the sharer
    reader.recv()
    sharer = resource_sharer._resource_sharer._thread
    assert sharer is not None and sharer.is_alive()
    others = set(threading.enumerate()) - {threading.main_thread(), sharer}
    assert fork_is_safe() == (not others)


LEAVES_A_GROUP = """
import torch.distributed as dist

from rlsmoke.engine.sharded import free_port

def test_leaves_a_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)

def test_after_it():
    pass
"""


def test_the_suite_fails_the_test_that_leaves_a_process_group_and_not_the_next(pytester):
    """The twin of tests/conftest.py's check: a group left in the pytest process is an error of its test.
    (torch is imported only in the inner session: pytester drops the modules a test imports.)"""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_group=LEAVES_A_GROUP)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaves_a_group*",
                                 "*this test left an initialized process group, * in the pytest process*"])  # fmt: skip


A_GROUP_WHOSE_THREAD_STARTS_LATE = LEAVES_A_GROUP.replace("""def test_after_it():
    pass""", """def test_after_it():
    import ctypes
    import threading

    started = threading.Event()

    def gloo_s_late_run_loop():  # as gloo's pt_gloo_runloop did under load: up during the next test
        ctypes.CDLL(None).prctl(15, b"pt_gloo_late", 0, 0, 0)  # PR_SET_NAME: the name /proc shows
        started.set()
        threading.Event().wait()

    threading.Thread(target=gloo_s_late_run_loop, daemon=True).start()
    started.wait(10)""")


def test_the_suite_fails_only_the_test_that_left_the_group_whose_thread_starts_late(pytester):
    """Under load gloo's run loop thread started after its group's test had ended, and the check failed
    the next test too. What appears after a group was left is that group's, unless it is a new group.
    (A test that leaves a group where nothing was left before it still fails: the test above.)"""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_group=A_GROUP_WHOSE_THREAD_STARTS_LATE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaves_a_group*"])


def _hold_megatron_s_groups_then_close_them(conn):
    import torch.distributed

    from rlsmoke.engine.megatron import dist
    from rlsmoke.engine.megatron.dist import Parallel
    from rlsmoke.engine.procs import distributed_leftovers, fork_is_safe

    torch.set_num_threads(1)  # as a rank runs: the thread count is another row of the rule
    before = fork_is_safe(), distributed_leftovers()
    dist.init(0, Parallel(), dist.free_port())
    during = distributed_leftovers()
    dist.close()
    conn.send((before, during, torch.distributed.is_initialized(), fork_is_safe(), distributed_leftovers()))


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_a_process_that_once_held_megatron_s_groups_forks_no_rank():
    """gloo's threads outlive the groups; ranks forked after `dist.close()` died of SIGSEGV before this rule."""
    from rlsmoke.engine.megatron.dist import RANK_MODULES
    from rlsmoke.engine.procs import rank_context

    ctx = rank_context(cpu_only=True, rank_modules=RANK_MODULES)  # a process of its own: the groups end with it
    before, during, grouped, safe, after = in_a_child(ctx, _hold_megatron_s_groups_then_close_them)
    assert before == (True, []) and not grouped and not safe
    assert during[0] == "an initialized process group" and any(t.startswith("gloo") for t in during), during
    # what tests/conftest.py names when a test leaves it in the pytest process: the threads outlive the group
    assert after and all(t.startswith(("pt_", "gloo")) for t in after), after
