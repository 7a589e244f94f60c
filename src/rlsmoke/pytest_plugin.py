"""rlsmoke's pytest plugin: options, markers, the skip hook, and the `artifacts` fixture.

Deciding lives in `rlsmoke.selection.decide` (a pure function of a test's markers and the host); the hook
here only applies it. GPU and port leases live in `rlsmoke.processes.lease`. Nothing heavy is imported
at module level: this module loads in every pytest session of every user of the package.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from rlsmoke import plugin_session

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


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("rlsmoke", "rlsmoke one-step GRPO end-to-end tests")
    g.addoption(
        "--num-gpus",
        type=int,
        metavar="N",
        help="GPUs a GPU case runs on, replacing its NUM_GPUS; 0 skips the GPU cases (default env NUM_GPUS, "
        "else the module's)",
    )
    g.addoption(
        "--platform",
        choices=("nvidia", "rocm", "cpu"),
        help="the host's platform when detection cannot see it (default detected by nvidia-smi/rocm-smi)",
    )
    g.addoption(
        "--launcher",
        choices=("builtin", "miles"),
        default="builtin",
        help="what runs GPU cases: the built-in engine or Miles under --miles-root (default builtin)",
    )
    g.addoption(
        "--trainer",
        choices=("fsdp", "megatron"),
        default="fsdp",
        help="the built-in engine's trainer: fsdp (HF modeling code, FSDP2 over several GPUs) or "
        "megatron (a megatron-core GPTModel through the HF <-> Megatron bridge; one device)",
    )
    g.addoption(
        "--miles-root",
        default=os.environ.get("MILES_ROOT"),
        metavar="DIR",
        help="a Miles checkout to launch from (default env MILES_ROOT)",
    )
    g.addoption(
        "--model-dir",
        metavar="DIR",
        help="prepared HF checkpoints, one folder per case, verified before launch (default the cache)",
    )
    g.addoption(
        "--artifacts-dir",
        metavar="DIR",
        help="where each test writes its logs, metrics and summaries (default <rootdir>/artifacts)",
    )
    g.addoption(
        "--update-golden",
        action="store_true",
        help="record each run's values as a thresholds candidate instead of gating (default off)",
    )
    g.addoption(
        "--history",
        default=os.environ.get("RLSMOKE_HISTORY"),
        metavar="DB",
        help="sqlite history to store runs in and band-gate against (default env RLSMOKE_HISTORY, else none)",
    )
    g.addoption(
        "--history-shadow",
        action="store_true",
        default=os.environ.get("RLSMOKE_HISTORY_SHADOW", "") not in ("", "0"),
        help="report history-band failures as warnings, not failures (PR runs; default env RLSMOKE_HISTORY_SHADOW)",
    )
    g.addoption(
        "--history-trusted",
        action="store_true",
        help="mark passing runs as trusted baselines for the history band (default off)",
    )
    g.addoption(
        "--prepare-ahead",
        type=int,
        metavar="N",
        help="checkpoints of the session's GPU cases prepared side by side as it starts, N at a time; 0: each "
        f"test prepares its own (default: {plugin_session.AHEAD_DEFAULT})",
    )
    g.addoption(
        "--run-timeout",
        type=float,
        metavar="S",
        help=f"seconds before a launched run is killed (default {plugin_session.TIMEOUT_DEFAULTS})",
    )


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    n = config.getoption("num_gpus", None)
    env = os.environ.get("NUM_GPUS")
    if n is None and env:
        try:
            n = int(env)
        except ValueError:
            raise pytest.UsageError(
                f"NUM_GPUS={env!r} is not an integer. Adjust NUM_GPUS or pass --num-gpus N"
            ) from None
    if n is not None and n < 0:  # 0 means "no GPUs": the CPU cases run, the GPU ones skip with a reason
        raise pytest.UsageError(f"--num-gpus={n} must be >= 0. Adjust --num-gpus or NUM_GPUS")
    config.option.num_gpus = n
    plugin_session.check_options(config)
    _hold_threads(config)
    from rlsmoke.engine.signals import sigterm_interrupts_session

    back_to_default = sigterm_interrupts_session()  # the runs' teardown on a CI job's timeout
    if back_to_default is not None:
        config.add_cleanup(back_to_default)
    root = config.getoption("miles_root")
    if config.getoption("launcher", "builtin") == "miles" and root and not Path(root).is_dir():
        raise pytest.UsageError(
            f"--miles-root={Path(root)} is not a folder. Pass a Miles checkout (train.py in it)"
        )
    listing = config.option.collectonly or config.getoption("showfixtures", False)  # the session runs no test
    if not hasattr(config, "workerinput") and not listing:  # xdist workers share their controller's
        fd = plugin_session.hold_artifacts_root(_artifacts_root(config))
        config.add_cleanup(lambda: os.close(fd))  # the lock goes with it


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
                raise pytest.UsageError(
                    f"--platform={forced} but this host has {host.describe()}. Drop --platform"
                )
            host = Host(forced, "unknown", config.getoption("num_gpus") or 0)  # a GPU platform, undetected
        config.stash[_HOST] = host
    return config.stash[_HOST]


def pytest_report_header(config: pytest.Config) -> str:
    n = config.getoption("num_gpus")
    return (f"rlsmoke: launcher={config.getoption('launcher')} num_gpus={n if n is not None else 'per module'} "
            f"artifacts={_artifacts_root(config)}")  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from rlsmoke.errors import RlsmokeError
    from rlsmoke.selection import decide

    for item in items:
        try:
            req = plugin_session.requirement_of(item)
        except RlsmokeError as exc:
            raise pytest.UsageError(f"{item.nodeid}: {exc.one_line()}") from None
        module = getattr(item, "module", None)  # a module's CASE: a case too big for the host skips here
        decision = decide(req, _host(config), launcher=config.getoption("launcher"),
                          miles_root=config.getoption("miles_root"), case=getattr(module, "CASE", None),
                          num_gpus=config.getoption("num_gpus"), trainer=config.getoption("trainer"))  # fmt: skip
        if not decision.run:
            item.add_marker(pytest.mark.skip(reason=decision.reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The GPU cases' checkpoints that are not in the cache yet start building, side by side."""
    config = session.config
    jobs = config.getoption("prepare_ahead")
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")  # one xdist worker asks for the lot
    if jobs == 0 or worker != "gw0" or config.option.collectonly or config.getoption("model_dir"):
        return
    if config.getoption("launcher") != "builtin":
        return  # Miles' runs read the checkpoint their flow converts
    from rlsmoke.checkpoints.ahead import PreparedAhead, default_jobs, missing

    cases = missing(plugin_session.gpu_checkpoints(session.items, config.getoption("num_gpus")))
    if not cases:
        return
    jobs = jobs or default_jobs(len(cases))
    logs = _artifacts_root(config) / "prepare-ahead"
    ahead = PreparedAhead(cases, logs, jobs=jobs)
    config.add_cleanup(ahead.close)
    if (reporter := config.pluginmanager.get_plugin("terminalreporter")) is not None:
        names = ", ".join(name for name, _ in cases)
        reporter.write_line(f"rlsmoke: preparing {names} ahead, {jobs} at a time (logs: {logs})")


def _artifacts_root(config: pytest.Config) -> Path:
    value = config.getoption("artifacts_dir")
    return Path(value).resolve() if value else Path(config.rootpath) / "artifacts"


@pytest.fixture(scope="session")
def rlsmoke_host(pytestconfig: pytest.Config):
    """The host the suite runs on (`rlsmoke.platforms.Host`)."""
    return _host(pytestconfig)


@pytest.fixture(scope="session")
def rlsmoke_ports():
    """This worker's block of ports (Ray GCS, dashboard, MASTER_PORT, ...): no other worker or session has it.
    Leased on first need, from the xdist worker's index; released as the session ends."""
    from rlsmoke.processes.lease import lease_ports

    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    ports = lease_ports(start=int(worker.group(1)) if worker else 0)
    yield ports
    ports.release()


@pytest.fixture(scope="module")
def rlsmoke_variant_runs(request: pytest.FixtureRequest):
    """The module's SHARED_RUN (`rlsmoke.suite.VariantRuns`): its one-step test and its fault twins take
    their records from one run of all its variants, one load; None for a module that declares none."""
    from rlsmoke.suite import VariantRuns

    variants = tuple(getattr(request.module, "SHARED_RUN", ()))
    return VariantRuns(variants) if variants else None


@pytest.fixture
def gpu_lease(request: pytest.FixtureRequest, rlsmoke_host):
    """The GPU ids this test holds until it ends, disjoint from every other worker's; none for CPU tests."""
    from rlsmoke.processes.lease import GpuLease, lease_gpus, visible_gpu_ids

    if (req := plugin_session.requirement_of(request.node)) is None or req.platform == "cpu" or req.gpus == 0:
        yield GpuLease("cpu", ())
        return
    timeout = float(os.environ.get("RLSMOKE_LEASE_TIMEOUT", 3600))
    lease = lease_gpus(
        req.platform, visible_gpu_ids(req.platform, rlsmoke_host.count), req.gpus, timeout=timeout
    )
    yield lease
    lease.release()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, gpu_lease, rlsmoke_ports, record_property):
    """The test's artifacts folder (emptied first) with the session's launcher, leases and history."""
    config = request.config
    from rlsmoke.artifacts import Artifacts

    folder = _artifacts_root(config) / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid).strip("_")
    plugin_session.refuse_a_live_run(folder)
    shutil.rmtree(folder, ignore_errors=True)  # a stale summary.json from an earlier run must not be read
    folder.mkdir(parents=True, exist_ok=True)
    history = config.getoption("history")
    miles_root = config.getoption("miles_root")
    model_dir = config.getoption("model_dir")
    return Artifacts(
        path=folder, launcher=config.getoption("launcher"), trainer=config.getoption("trainer"), host=_host(config),
        num_gpus=config.getoption("num_gpus"),
        miles_root=Path(miles_root) if miles_root else None, model_dir=Path(model_dir) if model_dir else None,
        lease=gpu_lease, ports=rlsmoke_ports,
        timeout=config.getoption("run_timeout"),
        update_golden=config.getoption("update_golden"), history=Path(history) if history else None,
        trusted=config.getoption("history_trusted"), history_shadow=config.getoption("history_shadow"),
        commit=plugin_session.commit_of(config) if history else "unknown", record_property=record_property,
    )  # fmt: skip


@pytest.fixture
def case_record(request: pytest.FixtureRequest, artifacts, rlsmoke_variant_runs):
    """The record of the test's declared run (`rlsmoke.suite.CaseRun`): its `case_record` parameter
    (`indirect=True`), else its module's CASE (with its SHARED_RUN, when it declares one)."""
    if (spec := plugin_session.declared_run(request.node)) is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses case_record without a run: parametrize it with "
                                "rlsmoke.suite.CaseRun values (indirect=True) or give its module a CASE")  # fmt: skip
    return spec.run(artifacts, variant_runs=rlsmoke_variant_runs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A case built inside a test that does not fit the host's GPUs is a skip, as at collection."""
    from rlsmoke.selection import DoesNotFit

    try:
        return (yield)
    except DoesNotFit as exc:
        pytest.skip(str(exc))


def pytest_sessionfinish(session: pytest.Session) -> None:
    root = _artifacts_root(session.config)
    if hasattr(session.config, "workerinput") or not root.is_dir():
        return  # an xdist worker: the controller writes it once
    from rlsmoke.report import SESSION_HEADER, SUMMARY_MD, write_session_summary

    summary = root / SUMMARY_MD
    if summary.is_file() and not summary.read_text(errors="replace").startswith(SESSION_HEADER):
        if (reporter := session.config.pluginmanager.get_plugin("terminalreporter")) is not None:
            reporter.write_line(
                f"rlsmoke: {summary} was not written by rlsmoke: left as it is, no session summary"
            )
        return
    write_session_summary(root)
