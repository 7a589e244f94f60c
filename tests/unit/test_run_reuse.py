"""`--repeat K` loads once: seed k of a repeat run restores the initial weights in place and gives the
same bits as a fresh `rlsmoke run --seed k`, for each trainer and at 2 gloo ranks (FSDP2, the path two
GPUs take), though only a run's first seed has deterministic mode's NaN fill. The twin skips the restore
and sees seed 1 start from seed 0's trained weights; the fill's twin reads memory never written.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.utils.deterministic as det

from rlsmoke.cases import Case
from rlsmoke.engine import megatron
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.placement import Colocated
from rlsmoke.engine.run import execute
from rlsmoke.engine.timing import phase_seconds
from rlsmoke.errors import RunError
from rlsmoke.processes import here, runner
from rlsmoke.suite import CaseRun, builtin_argv

CASE = "glm5-744b-a40b-4layer"
SHAPE = {"n_prompts": 2, "n_samples": 2, "max_response_len": 6}
SHAPE_FLAGS = ("--n-prompts", "2", "--n-samples", "2", "--max-response-len", "6")
ONE, TWO = Case(CASE, platform="cpu", tiny=True), Case(CASE, platform="cpu", num_gpus=2, tiny=True)
# Each layout's fresh `rlsmoke run --seed 1`, declared: it may run ahead of its test.
FRESH_SEED_1 = [
    pytest.param(CaseRun(ONE, seed=1, flags=SHAPE_FLAGS), id="fsdp"),
    pytest.param(CaseRun(ONE, seed=1, trainer="megatron", flags=SHAPE_FLAGS), id="megatron",
                 marks=pytest.mark.skipif(not megatron.available(), reason="megatron-core is not installed")),
    pytest.param(CaseRun(TWO, seed=1, flags=(*SHAPE_FLAGS, "--offload")), id="fsdp2-2-ranks-offload"),
]  # fmt: skip


def _seed_lines(out, repeat: int | None = None) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    if repeat is None:
        return lines
    return [{k: v for k, v in line.items() if k != "repeat"} for line in lines if line["repeat"] == repeat]


def _argv(spec: CaseRun, out: Path, *, seed: int, more=()) -> list[str]:
    """`rlsmoke run` of the declared run at another seed, as a user types it."""
    return builtin_argv(spec.case, out, seed=seed, trainer=spec.trainer or "fsdp") + [*spec.flags, *more]


@pytest.mark.parametrize("case_record", FRESH_SEED_1, indirect=True)
def test_seed_k_of_a_repeat_is_a_fresh_seed_k_run(case_record, request, tmp_path):
    spec = request.node.callspec.params["case_record"]
    repeat, fresh = tmp_path / "repeat", Path(case_record.artifacts)
    argv, log = _argv(spec, repeat, seed=0, more=("--repeat", "2")), tmp_path / "repeat.log"
    if spec.trainer == "megatron":  # as the suite runs it: its process group would stay in this process
        result = runner.run(argv, env=runner.clean_env(), log=log, timeout=300, start=here.start_forked)
    else:
        result = here.run_here(argv, env=runner.clean_env(), log=log, timeout=300)
    assert result.ok, result.log.read_text()[-3000:]

    assert _seed_lines(repeat, 1) == _seed_lines(fresh)
    assert _seed_lines(repeat, 0) != _seed_lines(fresh)  # the seeds do differ
    summary = json.loads((repeat / "summary.json").read_text())
    timing = summary["timing"]
    assert len(timing["per_seed_s"]) == 2 and len(timing["restore_s"]) == 1
    assert {"rollout", "forward_only", "train_step", "sync", "offload"} <= timing["phases_s"].keys()
    assert timing["load_s"] > 0
    assert timing["compile_s"] == 0  # no fla kernels on CPU: nothing compiles before the first seed
    # where the load's seconds went, inside load_s: each part in one process; keeping the initial weights always
    # summary.json rounds each figure to the millisecond: the sum of n rounded parts may pass the rounded
    # whole by half a millisecond each
    phases = timing["load_phases_s"]
    assert sum(phases.values()) <= timing["load_s"] + 0.0005 * (len(phases) + 1)
    trained_by = ["megatron import", "process group", "read", "build", "convert", "trainer setup"] \
        if spec.trainer == "megatron" else ["read", "compute copy", "trainer setup"]  # fmt: skip
    one_process = [*trained_by, "rollout copy"] if spec.case.num_gpus == 1 else []
    assert list(timing["load_phases_s"]) == [*one_process, "keep initial"]
    # the process's own seconds before the engine's clock, by phase
    assert list(timing["process_s"]) == ["start", "config", "engine import"]
    assert all(v >= 0 for v in timing["process_s"].values())
    assert summary["kda"] == ("reference" if spec.case.spec().family == "glm5.3-flash" else None)
    assert (timing["phases_s"]["offload"] > 0) == (
        "--offload" in spec.flags
    )  # the moves are timed where they happen
    assert summary["parallel"] | {"dp": 0} == {"tp": 1, "ep": 1, "pp": 1, "cp": 1, "dp": 0, "sp": False}
    assert (
        summary["parallel"]["dp"] == spec.case.num_gpus
    )  # the executed layout: data parallel over the ranks


@pytest.mark.parametrize("case_record", FRESH_SEED_1[:1], indirect=True)
def test_without_the_restore_seed_1_starts_from_trained_weights(case_record, tmp_path, monkeypatch):
    # the fresh seed 1 ran in the setup, before the patch: only the repeat goes without the restore
    monkeypatch.setattr(Colocated, "restore_initial", lambda self: None)
    execute(RunConfig(case=CASE, tiny=True, **SHAPE), tmp_path / "repeat", repeat=2)

    assert _seed_lines(tmp_path / "repeat", 1) != _seed_lines(Path(case_record.artifacts))


def test_a_phase_is_its_calls_less_the_offload_moves_they_made():
    called = {"rollout": 5.0, "forward_only": 2.0, "train_step": 3.0, "sync": 1.0}
    moved = {"rollout": 1.0, "train": 0.5, "step": 0.25, "sync": 0.125}
    assert phase_seconds(called, moved) == {"rollout": 4.0, "forward_only": 1.5, "train_step": 2.75, "sync": 0.875,
                                            "offload": 1.875}  # fmt: skip


@pytest.mark.parametrize("aliased", [False, True], ids=["device-copy", "twin-aliased-copy"])
def test_initial_weights_kept_on_the_device_restore_seed_k(tmp_path, monkeypatch, aliased):
    """`initial_on_device` (chosen on GPUs when the estimate leaves room) keeps the initial weights as a
    device copy; seed 1 of the repeat is still a fresh seed 1. The twin keeps the parameters themselves
    instead of a copy, so the "initial" weights are the trained ones and seed 1 differs."""
    from rlsmoke.engine import reuse

    if aliased:
        monkeypatch.setattr(reuse, "_device_copy", lambda t, dtype: t if t.dtype == dtype else t.to(dtype))
    cfg = RunConfig(case=CASE, tiny=True, **SHAPE)
    execute(cfg.replace(initial_on_device=True), tmp_path / "repeat", repeat=2)
    execute(cfg.replace(seed=1), tmp_path / "fresh", repeat=1)

    summary = json.loads((tmp_path / "repeat" / "summary.json").read_text())
    assert summary["memory"]["initial_on_device"] is True
    assert "initial weights: kept on the device" in (tmp_path / "repeat" / "run.log").read_text()
    assert (_seed_lines(tmp_path / "repeat", 1) == _seed_lines(tmp_path / "fresh")) is not aliased


def test_the_nan_fill_runs_the_first_seed_only(monkeypatch, tmp_path):
    """Each run's first seed has deterministic mode's NaN fill; a further seed, from the restore on, not."""
    filled = []
    seed = Colocated.manual_seed

    def seeded(self, s):  # each seed's start, after a further seed's restore
        filled.append(det.fill_uninitialized_memory)
        seed(self, s)

    monkeypatch.setattr(Colocated, "manual_seed", seeded)
    cfg = RunConfig(case=CASE, tiny=True, **SHAPE)
    execute(cfg, tmp_path / "repeat", repeat=3)
    # the caller's own setting, which a run leaves as it found it
    monkeypatch.setattr(det, "fill_uninitialized_memory", False)
    execute(cfg, tmp_path / "next", repeat=1)  # the next run in this process starts with it again

    assert filled == [True, False, False, True]
    assert det.fill_uninitialized_memory is False


def test_twin_memory_read_before_written_in_the_first_seed_stops_the_run(monkeypatch, tmp_path):
    """What the fill is kept for: a log-prob that reads a `torch.empty` it never wrote is NaN, and the
    loss's finite check names it."""
    from rlsmoke.engine import train

    logprobs = train.token_logprobs

    def reads_unwritten(model, group, temperature=1.0):
        logp, entropy = logprobs(model, group, temperature)
        return logp + torch.empty_like(logp) * 0, entropy

    monkeypatch.setattr(train, "token_logprobs", reads_unwritten)
    with pytest.raises(RunError) as caught:
        execute(RunConfig(case=CASE, tiny=True, **SHAPE), tmp_path / "run", repeat=1)
    assert caught.value.rule == "train.finite_loss"
