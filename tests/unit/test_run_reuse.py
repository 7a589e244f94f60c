"""`--repeat K` loads once: seed k of a repeat run restores the initial weights in place and gives the
same bits as a fresh `rlsmoke run --seed k`, for each trainer and at 2 gloo ranks (FSDP2, the path two
GPUs take). The twin skips the restore and sees seed 1 start from seed 0's trained weights.
"""

import json

import pytest

from rlsmoke.cases import Case
from rlsmoke.engine import megatron
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.placement import Colocated
from rlsmoke.engine.run import execute, phase_seconds
from rlsmoke.launch import runner
from rlsmoke.suite import builtin_argv

CASE = "glm5-744b-a40b-4layer"
SHAPE = {"n_prompts": 2, "n_samples": 2, "max_response_len": 6}
LAYOUTS = {
    "fsdp": {},
    "megatron": {"trainer": "megatron", "launcher": "builtin-megatron"},
    "fsdp2-2-ranks-offload": {"num_gpus": 2, "offload": True},
}


def _execute_in_a_rank(rank, par, cfg, out, repeat):
    return execute(cfg, out, repeat=repeat)


def _execute(cfg, out, repeat=1):
    """The run in this process; megatron's in a rank of its own (world size 1, as it colocates), whose
    process group ends with it."""
    if cfg.trainer != "megatron":
        return execute(cfg, out, repeat=repeat)
    from rlsmoke.engine.megatron.dist import Parallel, run_ranks

    [summary] = run_ranks(_execute_in_a_rank, Parallel(), cfg, out, repeat)
    return summary


def _seed_lines(out, repeat: int | None = None) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    if repeat is None:
        return lines
    return [{k: v for k, v in line.items() if k != "repeat"} for line in lines if line["repeat"] == repeat]


def _fresh_run(cfg: RunConfig, out, server) -> runner.Process:
    """`rlsmoke run` of `cfg`, as a user starts it (forked from the session's warm interpreter where
    there is one): it runs while this process runs the repeat."""
    case = Case(CASE, platform="cpu", num_gpus=cfg.num_gpus, tiny=True)
    argv = builtin_argv(case, out, seed=cfg.seed, trainer=cfg.trainer) + [
        "--n-prompts", str(cfg.n_prompts), "--n-samples", str(cfg.n_samples),
        "--max-response-len", str(cfg.max_response_len), *(["--offload"] if cfg.offload else [])]  # fmt: skip
    return runner.Process(argv, env=runner.clean_env(), log=out.parent / f"{out.name}.log", warm=server)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seed_k_of_a_repeat_is_a_fresh_seed_k_run(layout, tmp_path, rlsmoke_run_server):
    if layout == "megatron" and not megatron.available():
        pytest.skip("megatron-core is not installed")
    cfg = RunConfig(case=CASE, tiny=True, **SHAPE, **LAYOUTS[layout])
    fresh = _fresh_run(cfg.replace(seed=1), tmp_path / "fresh", rlsmoke_run_server)
    repeated = _execute(cfg, tmp_path / "repeat", repeat=2)
    result = fresh.wait(300)
    assert result.ok, result.log.read_text()[-3000:]

    assert _seed_lines(tmp_path / "repeat", 1) == _seed_lines(tmp_path / "fresh")
    assert _seed_lines(tmp_path / "repeat", 0) != _seed_lines(tmp_path / "fresh")  # the seeds do differ
    timing = repeated["timing"]
    assert len(timing["per_seed_s"]) == 2 and len(timing["restore_s"]) == 1
    assert {"rollout", "forward_only", "train_step", "sync", "offload"} <= timing["phases_s"].keys()
    assert timing["load_s"] > 0
    assert (timing["phases_s"]["offload"] > 0) == cfg.offload_active  # the moves are timed where they happen
    assert repeated["parallel"] | {"dp": 0} == {"tp": 1, "ep": 1, "pp": 1, "cp": 1, "dp": 0, "sp": False}
    assert repeated["parallel"]["dp"] == cfg.num_gpus  # the executed layout: data parallel over the ranks


def test_without_the_restore_seed_1_starts_from_trained_weights(tmp_path, monkeypatch, rlsmoke_run_server):
    monkeypatch.setattr(Colocated, "restore_initial", lambda self: None)  # in this process only: the repeat
    cfg = RunConfig(case=CASE, tiny=True, **SHAPE)
    fresh = _fresh_run(cfg.replace(seed=1), tmp_path / "fresh", rlsmoke_run_server)
    execute(cfg, tmp_path / "repeat", repeat=2)
    assert fresh.wait(300).ok

    assert _seed_lines(tmp_path / "repeat", 1) != _seed_lines(tmp_path / "fresh")


def test_a_phase_is_its_calls_less_the_offload_moves_they_made():
    called = {"rollout": 5.0, "forward_only": 2.0, "train_step": 3.0, "sync": 1.0}
    moved = {"rollout": 1.0, "train": 0.5, "step": 0.25, "sync": 0.125}
    assert phase_seconds(called, moved) == {"rollout": 4.0, "forward_only": 1.5, "train_step": 2.75, "sync": 0.875,
                                            "offload": 1.875}  # fmt: skip
