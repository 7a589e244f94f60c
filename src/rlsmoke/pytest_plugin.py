"""rlsmoke's pytest plugin: options, markers, the skip hook, and the `artifacts` fixture.

Deciding lives in `rlsmoke.selection.decide` (a pure function of a test's markers and the host); the hook
here only applies it. GPU and port leases live in `rlsmoke.launch.lease`. Nothing heavy is imported
at module level: this module loads in every pytest session of every user of the package.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import pytest

# Help-text rule: a lowercase phrase saying what the option does, then "(default ...)" when it has one.
MARKERS = (
    "nvidia: needs NVIDIA GPUs (how many: the gpus marker); skipped with a reason elsewhere",
    "rocm: needs ROCm GPUs (how many: the gpus marker); skipped with a reason elsewhere",
    "cpu: runs on any host with the built-in engine at the tiny width",
    "gpus(n): the GPU count the test needs; --num-gpus or NUM_GPUS replaces it",
    "slow: takes more than a few seconds on a CPU host",
)

# torch's threads per engine process on a host without GPUs, where every case runs at the tiny width
# (hidden size 256): one thread computes it as fast as two, and two spin-wait for each other whenever
# anything else holds a core (a tiny run: 1.3 s per seed at 1 thread, 12-25 s at 2, 2 cores under load 3-4).
TINY_THREADS = 1

_HOST = pytest.StashKey["object"]()
_PORTS = pytest.StashKey["object"]()
_WARM = pytest.StashKey["object"]()
_SHARED = pytest.StashKey["object"]()
# The session's id for the runs its tests share (`rlsmoke.suite.SharedVariants`): set by the session that
# starts first (an xdist controller, before its workers start), inherited by its workers.
SHARED_RUNS_VAR = "RLSMOKE_SHARED_RUNS"


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("rlsmoke", "rlsmoke one-step GRPO end-to-end tests")
    g.addoption("--num-gpus", type=int, default=None, metavar="N",
                help="GPUs a GPU case runs on, replacing its NUM_GPUS; 0 skips the GPU cases (default env NUM_GPUS, "
                     "else the module's)")
    g.addoption("--platform", choices=("nvidia", "rocm", "cpu"), default=None,
                help="the host's platform when detection cannot see it (default detected by nvidia-smi/rocm-smi)")
    g.addoption("--launcher", choices=("builtin", "miles"), default="builtin",
                help="what runs GPU cases: the built-in engine or Miles under --miles-root (default builtin)")
    g.addoption("--trainer", choices=("fsdp", "megatron"), default="fsdp",
                help="the built-in engine's trainer: fsdp (HF modeling code, FSDP2 over several GPUs) or "
                     "megatron (a megatron-core GPTModel through the HF <-> Megatron bridge; one device)")
    g.addoption("--miles-root", default=os.environ.get("MILES_ROOT"), metavar="DIR",
                help="a Miles checkout to launch from (default env MILES_ROOT)")
    g.addoption("--model-dir", default=None, metavar="DIR",
                help="prepared HF checkpoints, one folder per case, verified before launch (default the cache)")
    g.addoption("--artifacts-dir", default=None, metavar="DIR",
                help="where each test writes its logs, metrics and summaries (default <rootdir>/artifacts)")
    g.addoption("--update-golden", action="store_true", default=False,
                help="record each run's values as a thresholds candidate instead of gating (default off)")
    g.addoption("--history", default=os.environ.get("RLSMOKE_HISTORY"), metavar="DB",
                help="sqlite history to store runs in and band-gate against (default env RLSMOKE_HISTORY, else none)")
    g.addoption("--history-shadow", action="store_true",
                default=os.environ.get("RLSMOKE_HISTORY_SHADOW", "") not in ("", "0"),
                help="report history-band failures as warnings, not failures (PR runs; default env RLSMOKE_HISTORY_SHADOW)")
    g.addoption("--history-trusted", action="store_true", default=False,
                help="mark passing runs as trusted baselines for the history band (default off)")
    g.addoption("--run-timeout", type=float, default=None, metavar="S",
                help="seconds before a launched run is killed (default 900 on CPU, 3600 on GPUs)")
    g.addoption("--cold-runs", action="store_true", default=False,
                help="start each CPU run as a fresh interpreter instead of forking it from the session's warm one "
                     "(default off: forked)")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    n = config.getoption("num_gpus", None)
    env = os.environ.get("NUM_GPUS")
    if n is None and env:
        try:
            n = int(env)
        except ValueError:
            raise pytest.UsageError(f"NUM_GPUS={env!r} is not an integer. Adjust NUM_GPUS or pass --num-gpus N") from None
    if n is not None and n < 0:  # 0 means "no GPUs": the CPU cases run, the GPU ones skip with a reason
        raise pytest.UsageError(f"--num-gpus={n} must be >= 0. Adjust --num-gpus or NUM_GPUS")
    config.option.num_gpus = n
    _hold_threads(config)
    _stop_runs_on_sigterm(config)
    if not os.environ.get(SHARED_RUNS_VAR):  # this session owns its shared runs' folder: it removes it at the end
        import uuid

        os.environ[SHARED_RUNS_VAR] = uuid.uuid4().hex[:12]
        config.stash[_SHARED] = os.environ[SHARED_RUNS_VAR]
    if config.getoption("launcher", "builtin") == "miles" and config.getoption("miles_root"):
        root = Path(config.getoption("miles_root"))
        if not root.is_dir():
            raise pytest.UsageError(f"--miles-root={root} is not a folder. Pass a Miles checkout (train.py in it)")


# coreutils' `timeout` sends its signal to pytest, then to pytest's process group, so pytest gets it
# twice; a runner that signals the group and the process does the same. Within this many seconds of the
# first, another SIGTERM is that same request: it must not cut the teardown that ends the runs.
REPEATED_SIGTERM_S = 5.0


def _stop_runs_on_sigterm(config: pytest.Config) -> None:
    """A CI job's timeout ends pytest with SIGTERM, which by default kills the interpreter before any
    teardown. The runs it launched lead sessions of their own, out of the signal's reach, and kept the
    GPU for the next job. The session turns SIGTERM into the Ctrl-C that ends them (`runner.Process.wait`),
    then pytest's teardown. A SIGTERM more than REPEATED_SIGTERM_S after the first ends it at once; one
    sooner is the same request again. A handler someone else set is kept.
    A process forked from the session (a multiprocessing pool's worker) gets SIGTERM's default back as it
    starts, which `Pool.terminate` counts on. Not only inside the handler: a Python handler runs between
    bytecodes, so a signal that lands just before a blocking wait (a pool worker taking its queue's
    lock) is noted and never acted on, and the pool waits for that worker forever."""
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    session_pid = os.getpid()
    ours = []

    def end_now() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def interrupt(signum, frame):
        if os.getpid() != session_pid:  # a fork the signal reached before its reset below
            end_now()
            return
        first = time.monotonic()

        def again(signum, frame):
            if time.monotonic() - first > REPEATED_SIGTERM_S:
                end_now()

        ours.append(again)
        signal.signal(signal.SIGTERM, again)
        raise KeyboardInterrupt("SIGTERM")

    ours.append(interrupt)

    def back_to_default() -> None:
        if signal.getsignal(signal.SIGTERM) in ours:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, interrupt)
    os.register_at_fork(after_in_child=back_to_default)
    config.add_cleanup(back_to_default)  # the session's end: this process's SIGTERM is the default again


def _hold_threads(config: pytest.Config) -> None:
    """Torch's threads for this session and the engine processes it launches (a variable the user set is kept)."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    cpu_host = _host(config).platform == "cpu"
    if workers == 1 and not cpu_host:
        return
    from rlsmoke.platforms import share_cores

    if cpu_host:  # the budget share_cores divides (OMP_NUM_THREADS leads the other variables there too)
        os.environ.setdefault("OMP_NUM_THREADS", str(TINY_THREADS))
    share_cores(workers)  # xdist: W workers each running torch on every core oversubscribe the CPU W times


def _host(config: pytest.Config):
    """Detected once per session, on first need; --platform fills in what detection cannot see."""
    if _HOST not in config.stash:
        from rlsmoke.platforms import Host, detect

        host, forced = detect(), config.getoption("platform")
        if forced and forced != host.platform:
            if host.platform != "cpu":
                raise pytest.UsageError(f"--platform={forced} but this host has {host.describe()}. Drop --platform")
            host = Host(forced, "CPU" if forced == "cpu" else "unknown",
                        0 if forced == "cpu" else (config.getoption("num_gpus") or 0))  # fmt: skip
        config.stash[_HOST] = host
    return config.stash[_HOST]


_RUN_FIXTURES = frozenset({"artifacts", "rlsmoke_run_server"})


def _may_launch(item: pytest.Item) -> bool:
    return bool(_RUN_FIXTURES & set(getattr(item, "fixturenames", ()))) and not item.get_closest_marker("skip")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The warm run server starts with the session on a CPU or NVIDIA host: it imports (8 s) on the core that
    collection (single-threaded, 4-5 s) leaves idle, and is stopped at the end of collection if no
    selected test launches a run. An xdist controller starts the one its workers share: they start
    after this hook, with its address in their environment. A session that has one in its environment
    (a worker, a nested session) attaches to it when its tests are collected."""
    from rlsmoke.launch.warm import SERVER_VAR

    config = session.config
    if not _listing(config) and not os.environ.get(SERVER_VAR) and _forks_runs(config):
        _warm_server(config)


def _listing(config: pytest.Config) -> bool:
    """--collect-only, --fixtures: the session runs no test."""
    return bool(config.option.collectonly or config.getoption("showfixtures", False))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep the warm run server only if a selected test will launch a run (it imports while others run)."""
    config = session.config
    if not _forks_runs(config) or _listing(config):
        return
    if any(_may_launch(item) for item in session.items):
        _warm_server(config)  # none with --cold-runs
    elif _WARM in config.stash:  # started during collection for a test that was then deselected or skipped
        _stop_warm_server(config)


def _forks_runs(config: pytest.Config) -> bool:
    """This host's runs may fork from a warm server (`launch.warm.FORKED_PLATFORMS`)."""
    from rlsmoke.launch.warm import FORKED_PLATFORMS

    return _host(config).platform in FORKED_PLATFORMS


def _warm_server(config: pytest.Config):
    """The session's `launch.warm.WarmServer` on a CPU or NVIDIA host (an outer session's, when nested);
    else None.

    A GPU run's imports took 11-20 s of each 35-75 s test on an H200. The server never initializes
    the GPU driver (fla's import would: `engine.procs.preloadable` leaves it to the runs), so a GPU
    run's fork initializes its own; where it has been initialized all the same, each run execs a
    fresh interpreter (`launch.warm.driver_refusal`). ROCm runs are spawned (`launch.warm` says why).
    """
    if config.getoption("cold_runs", False) or not _forks_runs(config):
        return None
    if _WARM not in config.stash:
        from rlsmoke.launch.runner import clean_env
        from rlsmoke.launch.warm import SERVER_VAR, WarmServer

        server = None
        if os.environ.get(SERVER_VAR):
            try:
                server = WarmServer.attach(os.environ[SERVER_VAR])
            except OSError:  # the outer session's server is gone: start our own
                server = None
        if server is None:
            server = WarmServer.start(clean_env())
            server.outer_var = os.environ.get(SERVER_VAR)  # put back at the end
            os.environ[SERVER_VAR] = server.socket_path  # a nested session (pytester) forks from it too
        config.stash[_WARM] = server
    return config.stash[_WARM]


def pytest_unconfigure(config: pytest.Config) -> None:
    ports = config.stash.get(_PORTS, None)
    if ports is not None:
        ports.release()
    _stop_warm_server(config)
    if config.stash.get(_SHARED, None) is not None and os.environ.get(SHARED_RUNS_VAR) == config.stash[_SHARED]:
        del os.environ[SHARED_RUNS_VAR]


def _shared_runs(config: pytest.Config) -> Path:
    """Where this session's shared runs go: hidden under the artifacts root (each test copies what it gates)."""
    return _artifacts_root(config) / ".shared-runs" / os.environ.get(SHARED_RUNS_VAR, "none")


def _stop_warm_server(config: pytest.Config) -> None:
    server = config.stash.get(_WARM, None)
    if server is not None and server.proc is not None:  # ours, not an outer session's
        from rlsmoke.launch.warm import SERVER_VAR

        if os.environ.get(SERVER_VAR) == server.socket_path:
            if server.outer_var:
                os.environ[SERVER_VAR] = server.outer_var
            else:
                del os.environ[SERVER_VAR]
        server.stop()
    config.stash[_WARM] = None


def pytest_report_header(config: pytest.Config) -> str:
    n = config.getoption("num_gpus")
    return (f"rlsmoke: launcher={config.getoption('launcher')} num_gpus={n if n is not None else 'per module'} "
            f"artifacts={_artifacts_root(config)}")  # fmt: skip


def _gpus_marker(item: pytest.Item) -> int | None:
    mark = item.get_closest_marker("gpus")
    if mark is None:
        return None
    if len(mark.args) != 1 or not isinstance(mark.args[0], int) or mark.args[0] < 1:
        raise pytest.UsageError(f"{item.nodeid}: gpus{mark.args} is wrong. Write @pytest.mark.gpus(N) with N >= 1")
    return mark.args[0]


def _requirement(item: pytest.Item):
    from rlsmoke.selection import requirement

    return requirement((m.name for m in item.iter_markers()), _gpus_marker(item), item.config.getoption("num_gpus"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from rlsmoke.errors import RlsmokeError
    from rlsmoke.selection import decide

    for item in items:
        try:
            req = _requirement(item)
        except RlsmokeError as exc:
            raise pytest.UsageError(f"{item.nodeid}: {exc.one_line()}") from None
        if req is None:
            continue
        module = getattr(item, "module", None)  # a module's CASE: a case too big for the host skips here
        decision = decide(req, _host(config), launcher=config.getoption("launcher"),
                          miles_root=config.getoption("miles_root"), case=getattr(module, "CASE", None),
                          num_gpus=config.getoption("num_gpus"), trainer=config.getoption("trainer"))  # fmt: skip
        if not decision.run:
            item.add_marker(pytest.mark.skip(reason=decision.reason))
def _artifacts_root(config: pytest.Config) -> Path:
    value = config.getoption("artifacts_dir")
    return Path(value).resolve() if value else Path(config.rootpath) / "artifacts"


def _worker_index() -> int:
    m = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="session")
def rlsmoke_host(pytestconfig: pytest.Config):
    """The host the suite runs on (`rlsmoke.platforms.Host`)."""
    return _host(pytestconfig)


@pytest.fixture(scope="session")
def rlsmoke_ports(pytestconfig: pytest.Config):
    """This worker's block of ports (Ray GCS, dashboard, MASTER_PORT, ...): no other worker or session has it."""
    return _ports(pytestconfig)


def _ports(config: pytest.Config):
    """Leased on first need; released as the session ends."""
    if _PORTS not in config.stash:
        from rlsmoke.launch.lease import lease_ports

        config.stash[_PORTS] = lease_ports(start=_worker_index())
    return config.stash[_PORTS]


@pytest.fixture(scope="session")
def rlsmoke_run_server(pytestconfig: pytest.Config):
    """The session's warm run server (`rlsmoke.launch.warm.WarmServer`) on a CPU host, else None.

    `run_case` forks from it; a test that starts `rlsmoke run` itself may too, with its `run`
    (`subprocess.run` with captured output, forked where that gives the same run).
    """
    return _warm_server(pytestconfig)


@pytest.fixture(scope="session")
def rlsmoke_shared_runs(pytestconfig: pytest.Config) -> Path:
    """A folder every xdist worker of this session shares, for runs several tests take their records from
    (`rlsmoke.suite.SharedVariants`); removed when the session ends."""
    return _shared_runs(pytestconfig)


@pytest.fixture
def gpu_lease(request: pytest.FixtureRequest, rlsmoke_host):
    """The GPU ids this test holds until it ends, disjoint from every other worker's; none for CPU tests."""
    from rlsmoke.launch.lease import GpuLease, lease_gpus, visible_gpu_ids

    req = _requirement(request.node)
    if req is None or req.platform == "cpu" or req.gpus == 0:
        yield GpuLease("cpu", ())
        return
    timeout = float(os.environ.get("RLSMOKE_LEASE_TIMEOUT", 3600))
    lease = lease_gpus(req.platform, visible_gpu_ids(req.platform, rlsmoke_host.count), req.gpus, timeout=timeout)
    yield lease
    lease.release()


def _commit(config: pytest.Config) -> str:
    import subprocess

    if os.environ.get("GITHUB_SHA"):
        return os.environ["GITHUB_SHA"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=config.rootpath, capture_output=True, text=True,
                             timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, gpu_lease, record_property):
    """The test's artifacts folder (emptied first) with the session's launcher, leases and history."""
    config = request.config
    from rlsmoke.artifacts import Artifacts

    folder = _artifacts_root(config) / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid).strip("_")
    shutil.rmtree(folder, ignore_errors=True)  # a stale summary.json from an earlier run must not be read
    folder.mkdir(parents=True, exist_ok=True)
    history = config.getoption("history")
    miles_root = config.getoption("miles_root")
    model_dir = config.getoption("model_dir")
    return Artifacts(
        path=folder, launcher=config.getoption("launcher"), trainer=config.getoption("trainer"), host=_host(config),
        num_gpus=config.getoption("num_gpus"),
        miles_root=Path(miles_root) if miles_root else None, model_dir=Path(model_dir) if model_dir else None,
        lease=gpu_lease, ports=_ports(config),
        timeout=config.getoption("run_timeout"),
        update_golden=config.getoption("update_golden"), history=Path(history) if history else None,
        trusted=config.getoption("history_trusted"), history_shadow=config.getoption("history_shadow"),
        commit=_commit(config) if history else "unknown", warm=_warm_server(config), record_property=record_property,
    )  # fmt: skip


@pytest.fixture
def case_record(request: pytest.FixtureRequest, artifacts, rlsmoke_shared_runs):
    """The record of the test's declared run (`rlsmoke.suite.CaseRun`): its `case_record` parameter
    (`indirect=True`), else its module's CASE (with its SHARED_RUN, when it declares one)."""
    spec = _declared_run(request.node)
    if spec is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses case_record without a run: parametrize it with "
                                "rlsmoke.suite.CaseRun values (indirect=True) or give its module a CASE")  # fmt: skip
    return spec.run(artifacts, shared_runs=rlsmoke_shared_runs)


def _declared_run(item: pytest.Item):
    """The run a test takes from `case_record`: its parameter, else its module's CASE."""
    from rlsmoke.suite import CaseRun

    callspec = getattr(item, "callspec", None)
    if callspec is not None and "case_record" in callspec.params:
        spec = callspec.params["case_record"]
    else:
        case = getattr(getattr(item, "module", None), "CASE", None)
        spec = CaseRun(case, shared=tuple(getattr(item.module, "SHARED_RUN", ()))) if case is not None else None
    return spec if isinstance(spec, CaseRun) else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A case built inside a test that does not fit the host's GPUs is a skip, as at collection."""
    from rlsmoke.selection import DoesNotFit

    try:
        return (yield)
    except DoesNotFit as exc:
        pytest.skip(str(exc))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller writes it once
    if session.config.stash.get(_SHARED, None) is not None:  # each test kept a copy of what it gated
        shutil.rmtree(_shared_runs(session.config), ignore_errors=True)
        with contextlib.suppress(OSError):
            _shared_runs(session.config).parent.rmdir()  # when no other session's is left in it
    root = _artifacts_root(session.config)
    if root.is_dir():
        from rlsmoke.report import write_session_summary

        write_session_summary(root)
