"""The engine end to end on CPU: the README's main job, determinism, the reward/grad-norm twin, Ray
async placement, the other two model families, and bad input. One run per fixture, many assertions.

The --inject twins (temperature-mismatch, stale-weights, rollout-noise, train-dropout) live in
tests/e2e/test_*_cpu.py, each model's with its one-step test; this module covers the gates those faults
cannot reach.
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from procs import ForkedCli, alive, first_on_path

from rlsmoke.cases import Case
from rlsmoke.cli import main
from rlsmoke.errors import ExitCode
from rlsmoke.repeats import gate_run
from rlsmoke.suite import CaseRun

CASE = "glm5-744b-a40b-4layer"
EVERY_METRIC = [
    "train/train_rollout_logprob_abs_diff", "train/train_rollout_logprob_abs_diff_max", "train/train_rollout_kl",
    "train/ppo_kl", "train/pg_loss", "train/pg_clipfrac", "train/grad_norm", "rollout/raw_reward",
    "rollout/log_probs", "rollout/rollout_log_probs", "rollout/entropy", "sync/mismatched_params",
]  # fmt: skip
# A `ray` first on the main job's search path: it notes that it was imported, then fails as a missing
# Ray would. The single-process mode must run where Ray is not installed.
NO_RAY = (
    "import pathlib\npathlib.Path(__file__).with_name('imported').touch()\nraise ImportError('no ray here')\n"
)


def _gated(out: Path) -> tuple[dict, object]:
    """`rlsmoke run`'s gates on a run folder: (summary.json, the verdict)."""
    verdict, _ = gate_run(out)
    return json.loads((out / "summary.json").read_text()), verdict


def _without_ray(out: Path, shadow: Path, *flags: str) -> tuple[object, bool]:
    """`rlsmoke run CASE --platform cpu FLAGS` from the CLI's first line, forked with the engine imported
    (Ray is not: `first_on_path` checks), with NO_RAY first on its path: (the process, whether it
    imported Ray)."""
    (shadow / "ray").mkdir()
    (shadow / "ray" / "__init__.py").write_text(NO_RAY)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))
    }
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--out", str(out), *flags]
    proc = ForkedCli(argv, env=env, setup=functools.partial(first_on_path, str(shadow)))
    stdout, stderr = proc.communicate(timeout=300)
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    return done, (shadow / "ray" / "imported").exists()


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """The README's main job: (its process, its folder, whether it imported Ray)."""
    out = tmp_path_factory.mktemp("main-job")
    proc, ray_imported = _without_ray(out, tmp_path_factory.mktemp("no-ray"))
    return proc, out, ray_imported


def test_main_job_passes_and_prints_the_table(main_job):
    proc, out, ray_imported = main_job
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "verdict: PASS" in proc.stdout and f"artifacts: {out}" in proc.stdout
    assert not ray_imported, "the single-process mode imported ray"


def test_the_ray_check_sees_a_run_that_imports_ray(tmp_path):
    """The main job's Ray check, tripped: an async run imports Ray, and is told it is missing."""
    proc, ray_imported = _without_ray(tmp_path / "out", tmp_path, "--mode", "async", "--num-gpus", "2")
    assert ray_imported and proc.returncode == ExitCode.USAGE and "[engine.ray]" in proc.stderr, proc.stderr


def test_main_job_writes_the_contract(main_job):
    _, out, _ = main_job
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["index"]) for x in lines] == [
        ("rollout", 0),
        ("step", 0),
        ("rollout", 1),
        ("step", 1),
    ]
    logged = {k for x in lines for k in x["metrics"]}
    assert set(EVERY_METRIC) <= logged, set(EVERY_METRIC) - logged
    summary = json.loads((out / "summary.json").read_text())
    assert {"case", "platform", "device", "launcher", "dtype", "seed", "versions", "metrics", "gates", "verdict",
            "artifacts"} <= set(summary)  # fmt: skip
    assert (summary["launcher"], summary["verdict"], summary["artifacts"]) == ("builtin", "PASS", str(out))
    assert set(summary["versions"]) == {"torch", "transformers", "python"}
    for gate in summary["gates"]:
        assert {"name", "metric", "value", "bound", "op", "passed", "margin", "provenance"} <= set(gate)
        assert (
            summary["metrics"][
                gate["metric"] if gate["reduce"] == "max" else f"{gate['metric']}@{gate['reduce']}"
            ]
            == gate["value"]
        )
    assert "rollout 0: {" in (out / "run.log").read_text()


def test_run_log_parses_like_a_miles_log_into_the_same_record(main_job):
    from rlsmoke.metrics import load_record

    _, out, _ = main_job
    assert load_record(out / "run.log").entries == load_record(out).entries


@pytest.mark.parametrize(
    "case_record", [CaseRun(Case(CASE, platform="cpu", tiny=True))], indirect=True, ids=[CASE]
)
def test_same_seed_gives_identical_metrics(main_job, case_record):
    """The same seed in this process (`processes.here`, as the suite runs it) as in a fresh interpreter."""
    _, out, _ = main_job
    assert (Path(case_record.artifacts) / "metrics.jsonl").read_text() == (out / "metrics.jsonl").read_text()


@pytest.mark.parametrize("case_record", [CaseRun(Case(CASE, platform="cpu", tiny=True), flags=("--reward", "deepscaler"))],
                         indirect=True, ids=["math-reward"])  # fmt: skip
def test_math_reward_on_an_untrained_model_fails_grad_norm_and_reward_range(case_record):
    """The twin of the grad_norm and reward gates: no reward variance, no gradient."""
    summary, _ = _gated(Path(case_record.artifacts))
    failed = {g["name"] for g in summary["gates"] if not g["passed"]}
    assert failed == {"grad_norm", "reward_min", "reward_max"} or failed == {"grad_norm", "reward_min"}, (
        failed
    )
    assert summary["metrics"]["train/grad_norm@min"] == 0.0


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray (pip install -e .[dev])")
@pytest.mark.parametrize("case_record", [CaseRun(Case(CASE, platform="cpu", num_gpus=2, mode="async", tiny=True))],
                         indirect=True, ids=["async-2"])  # fmt: skip
def test_ray_async_places_actors_on_separate_bundles_and_stops_its_cluster(case_record):
    summary, verdict = _gated(Path(case_record.artifacts))
    where = summary["placement"]
    assert where["train"]["pid"] != where["rollout"]["pid"]
    assert where["train"]["gpu_ids"] != where["rollout"]["gpu_ids"]  # bundle 0 trains, bundle 1 rolls out
    assert where["train"]["placement_group"] == where["rollout"]["placement_group"]
    assert summary["verdict"] == "PASS", verdict.report()
    assert summary["metrics"]["sync/mismatched_params"] == 0  # checked in the rollout actor, param by param
    # the run ended its cluster: the head, the actors and Ray's temp folder are gone
    assert not [role for role, pid in [("head", where["cluster"]["head_pid"]), ("train", where["train"]["pid"]),
                                       ("rollout", where["rollout"]["pid"])] if alive(pid)]  # fmt: skip
    assert not Path(where["cluster"]["temp_dir"]).exists()


# At the configs fixtures/thresholds/builtin.json was calibrated on (the defaults): Flash at 1 prompt of
# 8 tokens measured a log-prob slope of -2.4e-06 against the bound 1.7e-06 on one CPU thread.
FAMILIES = ["glm4.5-355b-a32b-4layer", "glm5.3-flash-4layer"]


@pytest.mark.parametrize("case_record", [CaseRun(Case(name, platform="cpu", tiny=True)) for name in FAMILIES],
                         indirect=True, ids=FAMILIES)  # fmt: skip
def test_other_families_run_and_pass_cheaply(case_record):
    out = Path(case_record.artifacts)
    assert "verdict" not in json.loads(
        (out / "summary.json").read_text()
    )  # the engine records; its caller gates
    assert gate_run(out)[0].passed


@pytest.mark.parametrize(("argv", "message"), [
    (["--checkpoint", "/nonexistent/ckpt"], "[checkpoint.exists] checkpoint=/nonexistent/ckpt is missing"),
    (["--inject", "bitflip"], "[inject.known]"),
    (["--inject", "temperature-mismatch"], "--rollout-temperature"),
    (["--num-gpus", "2", "--n-prompts", "3"], "[engine.dp_divides_prompts]"),
    (["--mode", "async", "--num-gpus", "4"], "[engine.placement]"),
    (["--platform", "nvidia"], "[engine.gpus]"),
    (["--rollout-dtype", "int4"], "[dtype.known]"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert main(["run", CASE, "--platform", "cpu", "--out", str(tmp_path), *argv]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
