"""What a test module calls: `run_case(case, artifacts)`, then `gates_for(case).check(record)`.

The runner: `run_case` runs one step of a case with the session's choices (`Artifacts`) and returns
its record together with those artifacts (`CaseRecord`): a CPU run in this process (`processes.here`: the
engine imported once per pytest worker), a GPU run spawned (`processes.runner`). Deciding which tests run
is `rlsmoke.selection`; gating is `rlsmoke.gating` (re-exported here for test modules).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke import metrics
from rlsmoke.artifacts import Artifacts
from rlsmoke.engine.config import parse_variants
from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.facts import RUN_TIMEOUT_S
from rlsmoke.gating import GateFailure, HistoryBandWarning, gates_for
from rlsmoke.launch import flow
from rlsmoke.launch.miles import Paths
from rlsmoke.processes import here, miles_flow, runner
from rlsmoke.runkey import RunKey
from rlsmoke.selection import GPU_PLATFORMS, DoesNotFit, effective_case, memory_shortfall, trainer_refusal

__all__ = ["Artifacts", "CaseRecord", "CaseRun", "GateFailure", "HistoryBandWarning", "CaseLaunch",
           "CPU_SHARED_VARIANTS", "CPU_TWINS", "GPU_SHARED_VARIANTS", "GPU_TWINS", "VariantRuns", "builtin_argv",
           "check_fault", "gates_for", "plan_launch", "run_case", "run_variants"]  # fmt: skip


@dataclass(frozen=True)
class CaseRecord(metrics.Record):
    """A suite run's record with the Artifacts (folder and session choices) it ran with, for `check`,
    and the case it ran (NUM_GPUS as the session gave it)."""

    ran_with: Artifacts | None = field(default=None, repr=False, compare=False)
    case: object = field(default=None, repr=False, compare=False)


# Gate-can-fail twins: each engine fault (a `rlsmoke run --variants` item) with the gates it must fail, as
# "name: metric" as the failure report writes them. A gate that never fails is not a gate.
CPU_TWINS = (
    ("temperature-mismatch@0.7",
     ("logprob_abs_diff: train/train_rollout_logprob_abs_diff =", "train_rollout_kl: train/train_rollout_kl =",
      "logprob_mean_diff: rollout/logprob_mean_diff@absmax =",
      "logprob_slope: train/train_rollout_logprob_slope@absmax =")),
    ("stale-weights", ("weight_sync: sync/mismatched_params =",)),
    ("rollout-noise=0.05", ("logprob_abs_diff_max: train/train_rollout_logprob_abs_diff_max =",
                            "train_rollout_kl: train/train_rollout_kl =")),
    ("train-dropout=0.1", ("ppo_kl_step0: train/ppo_kl@first =",)),
)  # fmt: skip
# On GPUs the temperature twin samples at 0.8 with a bf16 rollout: its noise hides the mismatch from the mean
# diffs; the log-prob slope, whose per-token noise averages out, saw it at eight times its bound on one H200.
GPU_TWINS = (
    ("temperature-mismatch@0.8", ("logprob_slope: train/train_rollout_logprob_slope@absmax =",)),
    ("stale-weights", ("weight_sync: sync/mismatched_params =",)),
    ("train-dropout=0.1", ("ppo_kl_step0: train/ppo_kl@first =",)),
)  # fmt: skip
# What a model's one-step test and its fault twins run as one `rlsmoke run --variants` (one process, one
# load): the clean run first, then each fault.
CPU_SHARED_VARIANTS = ("clean", *(variant for variant, _ in CPU_TWINS))
GPU_SHARED_VARIANTS = ("clean", *(variant for variant, _ in GPU_TWINS))


@dataclass(frozen=True)
class CaseRun:
    """One run of a case as a test declares it, for the plugin's `case_record` fixture:
    `@pytest.mark.parametrize("case_record", [CaseRun(CASE, inject="stale-weights")], indirect=True)`.

    `trainer` None: the session's --trainer.
    `flags`: more `rlsmoke run` flags for the built-in engine (`("--offload", "--num-rollout", "3")`).
    `shared`: the variants of a run this clean run is the first of (`VariantRuns`, the plugin's
    `rlsmoke_variant_runs`): the module's tests of those variants then share its process and its load.
    A module declares it as SHARED_RUN next to its CASE. Under another launcher the run is its own.
    """

    case: object  # rlsmoke.cases.Case
    inject: str | None = None
    seed: int = 0
    rollout_temperature: float | None = None
    trainer: str | None = None
    flags: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()

    def run(self, art: Artifacts, variant_runs: VariantRuns | None = None) -> CaseRecord:
        """The run's record; the clean variant of `variant_runs` (the module's `shared` run) when given."""
        art = art if self.trainer is None else dataclasses.replace(art, trainer=self.trainer)
        clean = self.inject is None and self.rollout_temperature is None
        if self.shared and variant_runs is not None and clean and art.launcher == "builtin":
            return variant_runs.record(self.case, art, "clean")
        return run_case(self.case, art, inject=self.inject, seed=self.seed,
                        rollout_temperature=self.rollout_temperature, flags=self.flags)  # fmt: skip


def run_case(case, artifacts: Artifacts | str | Path, *, inject: str | None = None, seed: int = 0,
             rollout_temperature: float | None = None,
             flags: tuple[str, ...] = ()) -> CaseRecord:  # fmt: skip
    """Run one step of `case` with the session's launcher; return its metrics record (`rlsmoke.metrics.Record`).

    Raises `DoesNotFit` when the case's full width does not fit the host's GPUs (the plugin skips),
    `RlsmokeError` for bad input (incl. a corrupt checkpoint, before anything launches) and
    `RunError` when the run broke or timed out; a finished run whose gates fail still returns.
    """
    launch = plan_launch(case, artifacts, inject=inject, seed=seed, rollout_temperature=rollout_temperature,
                         flags=flags)  # fmt: skip
    case, art = launch.case, launch.art
    if launch.launcher == "miles":
        paths = Paths(model_dir=str(art.model_dir or Paths.model_dir), output_dir=str(art.path / "miles"),
                      miles_root=str(art.miles_root))  # fmt: skip
        plan = case.plan(paths=paths)
        flow.check(plan)  # a half-converted checkpoint is refused before anything starts
        # a summary.json naming the run, so the thresholds key of a Miles log is known
        meta = RunKey.of_case(case, device=art.host.device, launcher="miles").to_json()
        (art.path / "summary.json").write_text(json.dumps(meta, indent=2) + "\n")
        result = miles_flow.run(plan, paths, miles_root=art.miles_root, ports=art.ports, env=launch.env,
                                artifacts=art.path, timeout=launch.timeout)  # fmt: skip
    else:
        result = _run_builtin(launch)
    _finished(launch, result)
    return _recorded(art, case)


def _run_builtin(launch: CaseLaunch) -> runner.Result:
    """A CPU run in this process where it can (`processes.here`); megatron's forked from the fork server (its
    process group would stay in this one), as are NVIDIA runs (a hang in a GPU kernel needs a process to
    kill, a GPU driver a process of its own); ROCm runs spawned."""
    log = launch.art.path / "pytest-run.log"
    here_ok = here.can_run_here(launch.argv)
    if here_ok and launch.case.platform == "cpu" and launch.art.trainer != "megatron":
        return here.run_here(launch.argv, env=launch.env, log=log, timeout=launch.timeout)
    start = here.start_forked if here_ok and launch.case.platform != "rocm" else None
    return runner.run(launch.argv, env=launch.env, log=log, timeout=launch.timeout, start=start)


@dataclass(frozen=True)
class CaseLaunch:
    """What `run_case` launches for a case: the built-in engine's argv and environment, or a Miles run."""

    case: object  # the effective rlsmoke.cases.Case
    art: Artifacts
    launcher: str
    timeout: float
    env: dict
    argv: tuple[str, ...] = ()  # the built-in engine's; Miles renders its own from the plan


def plan_launch(case, artifacts: Artifacts | str | Path, *, inject: str | None = None, seed: int = 0,
                rollout_temperature: float | None = None, flags: tuple[str, ...] = (),
                variants: tuple[str, ...] = ()) -> CaseLaunch:  # fmt: skip
    """What `run_case` would launch now (after the checks that come before any launch); with `variants`,
    one `rlsmoke run --variants` (`run_variants`)."""
    art = artifacts if isinstance(artifacts, Artifacts) else Artifacts(Path(artifacts))
    if inject:  # a fault twin is meant to fail: it must never reach the history baseline
        art = dataclasses.replace(art, history=None)
    art.path.mkdir(parents=True, exist_ok=True)
    case = effective_case(case, art.num_gpus)
    short = (
        memory_shortfall(case, art.host)
        or trainer_refusal(art.trainer, case, inject)
        or next((why for why in (trainer_refusal(art.trainer, case, _fault(v)) for v in variants) if why), "")
    )
    if short:  # the plugin skips modules whose CASE does not fit at collection; this catches the others
        raise DoesNotFit(short)
    checkpoint = _model_dir_checkpoint(case, art)
    timeout = art.timeout or RUN_TIMEOUT_S[case.platform]
    env = {**(art.lease.env() if art.lease else {})}
    if art.ports is not None:
        env["MASTER_PORT"] = str(art.ports.master)
    launcher = art.launcher if case.platform in GPU_PLATFORMS else "builtin"  # CPU cases: the built-in engine
    if launcher == "miles":
        if art.miles_root is None:
            raise RlsmokeError("launcher=miles without a Miles checkout", rule="launcher.miles_root",
                               fix="pass --miles-root DIR (or set MILES_ROOT)")  # fmt: skip
        if inject or rollout_temperature is not None or variants:
            asked = ", ".join(f"{name}={value!r}" for name, value in (("inject", inject), ("rollout_temperature",
                              rollout_temperature), ("variants", variants)) if value not in (None, ()))  # fmt: skip
            raise RlsmokeError(f"{asked} needs the built-in engine", rule="launcher.inject",
                               fix="run fault twins with --launcher builtin")  # fmt: skip
        if flags:
            raise RlsmokeError(f"flags={' '.join(flags)} are `rlsmoke run`'s, for the built-in engine",
                               rule="launcher.flags", fix="run this test with --launcher builtin")  # fmt: skip
        return CaseLaunch(case, art, launcher, timeout, env)
    argv = builtin_argv(case, art.path, inject=inject, seed=seed, rollout_temperature=rollout_temperature,
                        checkpoint=checkpoint, trainer=art.trainer) + list(flags)  # fmt: skip
    if variants:
        argv += ["--variants", ",".join(variants)]
    return CaseLaunch(case, art, launcher, timeout, runner.clean_env(env), tuple(argv))


def _finished(launch: CaseLaunch, result: runner.Result) -> None:
    """Raises when the run was refused or broke; a finished run whose gates fail is finished."""
    if launch.launcher == "builtin" and result.returncode == 2:
        raise RlsmokeError(f"`rlsmoke run` rejected the case: {result.tail(3)}", rule="run.usage",
                           fix=f"see {result.log}")  # fmt: skip
    if not result.ok:  # the run only records: `check` gates it
        what = (
            f"timed out after {launch.timeout:.0f} s"
            if result.timed_out
            else f"exited with {result.returncode}"
        )
        raise RunError(f"{launch.case.name} on {launch.case.platform} ({launch.launcher}) {what}; artifacts: "
                       f"{launch.art.path}\n{result.tail(20)}", rule="run.broke")  # fmt: skip


def _recorded(art: Artifacts, case) -> CaseRecord:
    """The record in `art.path`, kept with `art`; its values as the test's junit properties."""
    loaded = metrics.load_record(art.path)
    record = CaseRecord(loaded.entries, loaded.source, loaded.artifacts, loaded.meta, ran_with=art, case=case)
    for key in record.keys():
        art.record_property(key, record.value(key, "last"))
    art.record_property("artifacts", str(art.path))
    return record


def _fault(variant: str) -> str | None:
    """A --variants item's --inject (None for clean)."""
    inject = parse_variants(variant, 1.0)[0].inject
    return str(inject) if inject.kind else None


def run_variants(case, artifacts: Artifacts | str | Path, variants: Sequence[str], *,
                 flags: tuple[str, ...] = ()) -> dict[str, CaseRecord]:  # fmt: skip
    """One `rlsmoke run --variants` of `case` on the built-in engine: the workers load once, and each variant
    (`clean`, an --inject fault, `@T` for its rollout temperature) is its own run in `artifacts/<slug>`, bit
    for bit a fresh run of it. Returns each variant's record, by the variant as given. A fault's record
    never reaches the history baseline. Raises as `run_case` does."""
    launch = plan_launch(case, artifacts, flags=flags, variants=tuple(variants))
    _finished(launch, _run_builtin(launch))
    records = {}
    for text, variant in zip(variants, parse_variants(",".join(variants), 1.0), strict=True):
        art = dataclasses.replace(launch.art, path=launch.art.path / variant.slug, record_property=lambda k, v: None,
                                  history=launch.art.history if not variant.inject.kind else None)  # fmt: skip
        records[text] = _recorded(art, launch.case)
    return records


class VariantRuns:
    """Declared variants of one case, run as one `run_variants` (one load) by the test that asks first;
    each test then gates its own variant's records (`record`). A module-scoped fixture holds one
    (the plugin's `rlsmoke_variant_runs`, for a module's SHARED_RUN).

    `variants` as `rlsmoke run --variants` takes them. A variant the session's trainer cannot run is left
    out of the shared run, and its test skips (`DoesNotFit`), as `run_case` would.
    """

    def __init__(self, variants: Sequence[str], *, flags: tuple[str, ...] = ()):
        parse_variants(",".join(variants), 1.0)  # a bad declaration fails at collection, not in a test
        self.variants, self.flags = tuple(variants), tuple(flags)
        self._runs: dict = {}  # (case, trainer) -> the records by variant, or what the run raised

    def record(self, case, artifacts: Artifacts, variant: str) -> CaseRecord:
        """`variant`'s record, from the shared run (made in the artifacts of the test that asked first)."""
        if variant not in self.variants:
            raise RlsmokeError(f"variant {variant!r} is not one of {', '.join(self.variants)}",
                               rule="suite.variants", fix="declare it in the VariantRuns")  # fmt: skip
        if _fault(variant) and artifacts.launcher != "builtin":
            raise DoesNotFit(f"faults go into the built-in engine, not --launcher {artifacts.launcher}")
        ran = effective_case(case, artifacts.num_gpus)
        if why := trainer_refusal(artifacts.trainer, ran, _fault(variant)):
            raise DoesNotFit(why)
        key = (ran, artifacts.trainer)
        if key not in self._runs:
            runnable = [v for v in self.variants if not trainer_refusal(artifacts.trainer, ran, _fault(v))]
            try:
                self._runs[key] = run_variants(case, artifacts, runnable, flags=self.flags)
            except (RunError, RlsmokeError) as exc:  # each of its tests fails with it, none runs it again
                self._runs[key] = exc
        got = self._runs[key]
        if isinstance(got, Exception):
            raise got
        ran_with = dataclasses.replace(got[variant].ran_with, record_property=artifacts.record_property)
        return _recorded(ran_with, got[variant].case)  # its values as this test's junit properties


def check_fault(case, record: CaseRecord, expected: Sequence[str]) -> GateFailure:
    """A fault twin's check: `case`'s gates fail, each of `expected` ("name: metric") among them."""
    try:
        gates_for(case).check(record)
    except GateFailure as failure:
        missing = [line for line in expected if line not in str(failure)]
        assert not missing, f"{record.artifacts}: did not fail {missing}:\n{failure}"
        return failure
    raise AssertionError(f"{record.artifacts}: the fault passed every gate")


def builtin_argv(case, out: Path, *, inject=None, seed=0, rollout_temperature=None, checkpoint=None,
                 trainer: str = "fsdp") -> list[str]:  # fmt: skip
    """`rlsmoke run` for a case: its flags are the case's fields, one flag per field that is set."""
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", case.name, "--platform", case.platform,
            "--num-gpus", str(case.num_gpus), "--tiny" if case.tiny else "--no-tiny", "--seed", str(seed),
            "--out", str(out), "--trainer", trainer, "--records-only"]  # the engine labels its key by trainer  # fmt: skip
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


def _model_dir_checkpoint(case, art: Artifacts) -> Path | None:
    """`<model_dir>/<case>` when it exists, verified: a corrupt checkpoint fails before any launch."""
    if art.model_dir is None:
        return None
    if not (folder := Path(art.model_dir) / case.name).exists():
        if art.launcher == "miles" and case.platform in GPU_PLATFORMS:
            raise RlsmokeError(f"model_dir={art.model_dir} has no {case.name}/", rule="checkpoint.missing",
                               fix=f"prepare it with `rlsmoke prepare {case.name}` or fix --model-dir")  # fmt: skip
        return None  # the built-in engine prepares and caches its own
    # torch (checkpoints.shards): imported only when a model dir is given
    from rlsmoke.checkpoints import verify

    verify(folder)
    return folder
