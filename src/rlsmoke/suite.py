"""What a test module calls: `run_case(case, artifacts)` and `gates_for(case).check(record)`.

The plugin decides whether a test runs (`decide`, a pure function of the test's markers and the
host) and hands the test an `Artifacts`: its folder plus the session's choices (launcher, leased GPUs
and ports, history). `run_case` launches through `launch.runner`; `check` applies the thresholds
(`rlsmoke.metrics`), then the history band (`rlsmoke.history`), and fails with every mismatch.
No torch here: the engine runs in its own process.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.platforms import Host

GPU_PLATFORMS = ("nvidia", "rocm")
VENDOR = {"nvidia": "NVIDIA", "rocm": "ROCm"}
# The built-in engine trains colocated over any number of devices (FSDP2, `engine.sharded`), but
# its async placement is one trainer plus one rollout engine; ROCm pairs default to async.
BUILTIN_ASYNC_GPUS = 2
DEFAULT_TIMEOUT_S = {"cpu": 900.0, "nvidia": 3600.0, "rocm": 3600.0}


# --- deciding: which tests run on this host -------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """What a test needs, read off its markers: a platform and a GPU count (0 for CPU tests)."""

    platform: str  # "nvidia" | "rocm" | "cpu"
    gpus: int


@dataclass(frozen=True)
class Decision:
    run: bool
    reason: str = ""


def requirement(markers: Iterable[str], gpus_marker: int | None, override: int | None) -> Requirement | None:
    """None for a test without a platform marker (a unit test): it always runs."""
    names = set(markers)
    gpu_platforms = [p for p in GPU_PLATFORMS if p in names]
    if len(gpu_platforms) > 1:
        raise RlsmokeError(f"markers={sorted(gpu_platforms)} on one test", rule="markers.platform",
                           fix="mark each test with one of nvidia, rocm (split the test in two)")  # fmt: skip
    if gpu_platforms:
        gpus = override if override is not None else (gpus_marker if gpus_marker is not None else 1)
        return Requirement(gpu_platforms[0], gpus)
    if "cpu" in names:
        return Requirement("cpu", 0)
    return None


def decide(req: Requirement | None, host: Host, *, launcher: str = "builtin", miles_root: str | None = None) -> Decision:
    """Whether a test with requirement `req` runs on `host`; the reason names what was needed and found."""
    if req is None or req.platform == "cpu":
        return Decision(True)
    need = f"{req.gpus} {VENDOR[req.platform]} GPU{'s' if req.gpus != 1 else ''}"
    if host.platform != req.platform or host.count < req.gpus:
        return Decision(False, f"needs {need}; found {host.describe()}")
    if launcher == "miles" and not miles_root:
        return Decision(False, f"needs {need} and a Miles checkout: --launcher miles without --miles-root "
                               "(or env MILES_ROOT); pass --miles-root DIR")  # fmt: skip
    if launcher == "builtin" and req.platform == "rocm" and req.gpus != BUILTIN_ASYNC_GPUS:
        return Decision(False, f"needs {need} in async mode; the built-in engine places async on exactly "
                               f"{BUILTIN_ASYNC_GPUS}. Pass --launcher miles --miles-root DIR, or --num-gpus 2")  # fmt: skip
    return Decision(True)


# --- running -----------------------------------------------------------------------------------------


@dataclass
class Artifacts:
    """A test's artifacts folder plus the session's launch choices. `os.fspath()` gives the folder."""

    path: Path
    launcher: str = "builtin"
    host: Host = Host("cpu", "CPU", 0)
    num_gpus: int | None = None  # --num-gpus / NUM_GPUS when given: replaces the module's NUM_GPUS
    miles_root: Path | None = None
    model_dir: Path | None = None
    lease: object | None = None  # launch.lease.GpuLease
    ports: object | None = None  # launch.lease.PortLease
    timeout: float | None = None
    update_golden: bool = False
    history: Path | None = None
    trusted: bool = False
    history_shadow: bool = False  # report the band (a warning, the summary) but never fail on it: PR runs
    commit: str = "unknown"
    record_property: Callable[[str, object], None] = field(default=lambda k, v: None, repr=False)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, other) -> Path:
        return self.path / other


def effective_case(case, artifacts: Artifacts):
    """The case at the session's GPU count, when one was given (GPU cases only: CPU runs one device).

    On one GPU a case whose full width does not fit runs its one-GPU variant (`ONE_GPU_VARIANT`).
    """
    from rlsmoke.models import ONE_GPU_VARIANT

    if case.platform not in GPU_PLATFORMS:
        return case
    if artifacts.num_gpus is not None and case.num_gpus != artifacts.num_gpus:
        case = dataclasses.replace(case, num_gpus=artifacts.num_gpus)
    if case.num_gpus == 1 and case.name in ONE_GPU_VARIANT and not case.tiny:
        case = dataclasses.replace(case, name=ONE_GPU_VARIANT[case.name])
    return case


def memory_shortfall(case, host: Host) -> str:
    """Why a full-width GPU case cannot fit this host's devices ("" when it fits), as a skip reason."""
    from rlsmoke import memory

    return memory.shortfall(case, host)


def run_case(case, artifacts: Artifacts | str | Path, *, inject: str | None = None, seed: int = 0,
             rollout_temperature: float | None = None, timeout: float | None = None, echo=None):  # fmt: skip
    """Run one step of `case` with the session's launcher; return its metrics record (`rlsmoke.metrics.Record`).

    Raises `RlsmokeError` for bad input (incl. a corrupt checkpoint, before anything launches) and
    `RunError` when the run broke or timed out; a finished run whose gates fail still returns.
    """
    from rlsmoke import metrics
    from rlsmoke.launch import runner

    art = artifacts if isinstance(artifacts, Artifacts) else Artifacts(Path(artifacts))
    if inject:  # a fault twin is meant to fail: it must never reach the history baseline
        art = dataclasses.replace(art, history=None)
    art.path.mkdir(parents=True, exist_ok=True)
    case = effective_case(case, art)
    short = memory_shortfall(case, art.host)
    if short:
        import pytest

        pytest.skip(short)
    checkpoint = _verified_checkpoint(case, art)
    timeout = timeout or art.timeout or DEFAULT_TIMEOUT_S.get(case.platform, 3600.0)
    env = {**(art.lease.env() if art.lease else {})}
    if art.ports is not None:
        env["MASTER_PORT"] = str(art.ports.master)
    launcher = art.launcher if case.platform in GPU_PLATFORMS else "builtin"  # CPU cases: the built-in engine
    if launcher == "miles":
        if art.miles_root is None:
            raise RlsmokeError("launcher=miles without a Miles checkout", rule="launcher.miles_root",
                               fix="pass --miles-root DIR (or set MILES_ROOT)")  # fmt: skip
        if inject or rollout_temperature is not None:
            raise RlsmokeError(f"inject={inject!r} needs the built-in engine", rule="launcher.inject",
                               fix="run fault twins with --launcher builtin")  # fmt: skip
        from rlsmoke.launch.miles import Paths

        paths = Paths(model_dir=str(art.model_dir or Paths.model_dir), output_dir=str(art.path / "miles"))
        plan = case.plan(paths=paths)
        _write_meta(art, case, "miles")
        result = runner.run_miles(plan.launch, miles_root=art.miles_root, ports=art.ports, env=env,
                                  artifacts=art.path, timeout=timeout, echo=echo)  # fmt: skip
        broke = not result.ok
    else:
        argv = builtin_argv(case, art.path, inject=inject, seed=seed, rollout_temperature=rollout_temperature,
                            checkpoint=checkpoint)  # fmt: skip
        result = runner.run(argv, env=runner.clean_env(env), log=art.path / "pytest-run.log", timeout=timeout,
                            echo=echo)  # fmt: skip
        if result.returncode == 2:
            raise RlsmokeError(f"`rlsmoke run` rejected the case: {_tail(result.log, 3)}", rule="run.usage",
                               fix=f"see {result.log}")  # fmt: skip
        broke = result.returncode not in (0, 1)  # 1: a gate failed, which `check` reports in full
    if broke:
        what = f"timed out after {timeout:.0f} s" if result.timed_out else f"exited with {result.returncode}"
        raise RunError(f"{case.name} on {case.platform} ({launcher}) {what}; artifacts: {art.path}\n"
                       f"{_tail(result.log, 20)}", rule="run.broke")  # fmt: skip
    record = metrics.load_record(art.path)
    _RUNS[str(Path(record.artifacts).resolve())] = art  # so `check(record)` finds the session's choices
    for key in record.keys():
        art.record_property(key, record.value(key, "last"))
    art.record_property("artifacts", str(art.path))
    return record


def builtin_argv(case, out: Path, *, inject=None, seed=0, rollout_temperature=None, checkpoint=None) -> list[str]:
    """`rlsmoke run` for a case: its flags are the case's fields, one flag per field that is set."""
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", case.name, "--platform", case.platform,
            "--num-gpus", str(case.num_gpus), "--tiny" if case.tiny else "--no-tiny", "--seed", str(seed),
            "--out", str(out), "--launcher-label", "builtin"]  # fmt: skip
    if case.mode:
        argv += ["--mode", case.mode]
    for key, value in case.overrides:
        argv += ["--set", f"{key}={value}"]
    if inject:
        argv += ["--inject", inject]
    if rollout_temperature is not None:
        argv += ["--rollout-temperature", f"{rollout_temperature:g}"]
    if checkpoint is not None:
        argv += ["--checkpoint", str(checkpoint)]
    return argv


def _verified_checkpoint(case, art: Artifacts) -> Path | None:
    """`<model_dir>/<case>` when it exists, verified now: a corrupt checkpoint fails before any launch."""
    if art.model_dir is None:
        return None
    folder = Path(art.model_dir) / case.name
    if not folder.exists():
        if art.launcher == "miles" and case.platform in GPU_PLATFORMS:
            raise RlsmokeError(f"model_dir={art.model_dir} has no {case.name}/", rule="checkpoint.missing",
                               fix=f"prepare it with `rlsmoke prepare {case.name}` or fix --model-dir")  # fmt: skip
        return None  # the built-in engine prepares and caches its own
    from rlsmoke.checkpoints import verify

    verify(folder)
    return folder


def _write_meta(art: Artifacts, case, launcher: str) -> None:
    """A summary.json naming the run, so the thresholds key of a Miles log is known."""
    dtype = "float32/float32" if case.platform == "cpu" else "bfloat16/float32"
    meta = {"case": case.name, "platform": case.platform, "device": art.host.device, "launcher": launcher,
            "dtype": dtype, "width": "tiny" if case.tiny else "full", "num_gpus": str(case.num_gpus)}  # fmt: skip
    (art.path / "summary.json").write_text(json.dumps(meta, indent=2) + "\n")


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no log at {path})"


# Artifacts of each run of this process, by folder: the record carries only its folder.
_RUNS: dict[str, Artifacts] = {}


# --- gating -----------------------------------------------------------------------------------------


class GateFailure(AssertionError):
    """One or more gates failed; the message lists each with value, bound, margin, provenance, artifacts."""


class HistoryBandWarning(UserWarning):
    """A history band failed in shadow mode (`--history-shadow`): shown in pytest's summary, not gating."""


@dataclass(frozen=True)
class CaseGates:
    case: object
    artifacts: Artifacts | None = None

    def verdict(self, record):
        """The thresholds' verdict on `record`, without raising."""
        from rlsmoke import metrics

        return metrics.gates_for(record, platform=record.meta.get("platform") or self.case.platform).check(record)

    def check(self, record, artifacts: Artifacts | None = None):
        """Apply the thresholds and the history band; raise `GateFailure` listing every failure."""
        from rlsmoke import history, report

        art = artifacts or self.artifacts or _artifacts_of(record)
        verdict = self.verdict(record)
        bands = []
        if art is not None and art.history is not None and not art.update_golden:
            bands = history.record_and_check(art.history, record, verdict, commit=art.commit, trusted=art.trusted)
        if art is not None:
            for r in verdict.results:
                art.record_property(f"gate:{r.gate.name}", "PASS" if r.passed else f"FAIL {r.line()}")
            for b in bands:
                shadow = "SHADOW " if art.history_shadow else ""
                art.record_property(f"band:{b.metric}", "PASS" if b.passed else f"{shadow}FAIL {b.line()}")
            report.write_run_summary(art.path, record, verdict, bands, shadow=art.history_shadow)
            if art.update_golden:
                path = report.write_threshold_candidate(art.path, record, verdict)
                art.record_property("threshold_candidate", str(path))
                return verdict  # recording, not gating: the candidate goes to review
        failed_bands = [b for b in bands if not b.passed]
        if failed_bands and art is not None and art.history_shadow:
            warnings.warn(HistoryBandWarning(history.report(failed_bands)), stacklevel=2)
            failed_bands = []
        if not verdict.passed or failed_bands:
            lines = [verdict.report()] if not verdict.passed else []
            if failed_bands:
                lines.append(history.report(failed_bands))
            raise GateFailure("\n".join(lines))
        return verdict


def _artifacts_of(record) -> Artifacts | None:
    folder = getattr(record, "artifacts", "")
    if not folder:
        return None
    return _RUNS.get(str(Path(folder).resolve())) or Artifacts(Path(folder))


def gates_for(case, artifacts: Artifacts | None = None) -> CaseGates:
    """The gates of `case`: thresholds from fixtures/thresholds/ for the run's key, plus the history band."""
    return CaseGates(case, artifacts)
