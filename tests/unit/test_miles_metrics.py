"""Metrics as Miles gives them: its job log (prefixed, each step twice) and its CI history JSONL.

The fake checkout's `train.py` (miles_fake) runs as a real subprocess with the argv and env the plan
renders; its log and JSONL are read as a Miles run's. Each check has its twin: a metric missing from
the JSONL, a JSONL that disagrees with the log, a step logged twice differently, a reward of 0 everywhere.
"""

import json
import subprocess
import sys

import pytest
from miles_fake import write_root

from rlsmoke import metrics
from rlsmoke.cases import Case
from rlsmoke.errors import RlsmokeError
from rlsmoke.gating import GateFailure
from rlsmoke.launch import flow
from rlsmoke.launch.miles import Paths
from rlsmoke.platforms import Host
from rlsmoke.processes import runner
from rlsmoke.recipe import Recipe
from rlsmoke.suite import Artifacts, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=2)


def _miles_run(tmp_path, *, fault=None, reward="target"):
    """The fake `train.py` run as the plan launches it; returns its artifacts folder."""
    root = write_root(tmp_path / "miles", fault)
    paths = Paths(model_dir=str(tmp_path / "models"), output_dir=str(tmp_path / "out"), miles_root=str(root))
    plan = CASE.plan(paths=paths, recipe=Recipe(reward=reward))
    ref = tmp_path / "models" / f"{CASE.name}_torch_dist"
    ref.mkdir(parents=True)
    (ref / flow.TRACKER).write_text(flow.RELEASE)
    art = tmp_path / "art"
    art.mkdir()
    env = runner.clean_env({**plan.launch.env, flow.RECORD_DIR_VAR: str(art / flow.CI_HISTORY)})
    with (art / "run.log").open("w") as log:
        proc = subprocess.run([sys.executable, *plan.launch.argv[1:]], cwd=root, env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=120)  # fmt: skip
    assert proc.returncode == 0, (art / "run.log").read_text()[-2000:]
    return art


def _gate(art):
    record = metrics.load_record(art)
    gates_for(CASE, Artifacts(art, launcher="miles", host=Host("nvidia", "H200", 2))).check(record)
    return record


def test_a_miles_run_is_read_from_its_log_and_its_jsonl(tmp_path):
    art = _miles_run(tmp_path)
    log = (art / "run.log").read_text().splitlines()
    steps = [line for line in log if " step 0: {" in line]
    # each step logged twice, as Miles does: from two places (file:line differ), the same dict
    assert len(steps) == 2 and steps[0].split(" - ", 1)[1] == steps[1].split(" - ", 1)[1]
    assert steps[0].startswith("(MegatronTrainRayActor pid=") and "train.py:" in steps[0]
    record = _gate(art)
    assert sorted(record.entries["step"]) == [0, 1, 2] and sorted(record.entries["rollout"]) == [0, 1, 2]
    # the dense target reward gives every group reward variance, so the step has a gradient
    assert 0.0 < record.value("rollout/raw_reward", "min") < 1.0
    assert record.value("train/grad_norm", "min") > 0.0
    history = metrics.read_ci_history(art / flow.CI_HISTORY)
    assert set(history) == set(metrics.CI_HISTORY_METRICS)
    assert history["train/grad_norm"] == {i: v["train/grad_norm"] for i, v in record.entries["step"].items()}


def test_twin_a_metric_missing_from_the_jsonl(tmp_path):
    art = _miles_run(tmp_path, fault="ci_history_missing")
    with pytest.raises(RlsmokeError, match="has no train/train_rollout_kl") as err:
        metrics.load_record(art)
    assert err.value.rule == "metrics.ci_history_missing"


def test_twin_a_jsonl_that_disagrees_with_the_log(tmp_path):
    art = _miles_run(tmp_path, fault="ci_history_disagrees")
    with pytest.raises(RlsmokeError) as err:
        metrics.load_record(art)
    assert err.value.rule == "metrics.ci_history_disagrees"
    assert "train/grad_norm at step 0" in str(err.value)


def test_twin_a_step_logged_twice_with_different_values(tmp_path):
    art = _miles_run(tmp_path, fault="log_repeat")
    with pytest.raises(RlsmokeError) as err:
        metrics.load_record(art)
    assert err.value.rule == "metrics.log_repeat" and "`step 0` twice" in str(err.value)


def test_twin_a_reward_of_0_everywhere_trips_the_grad_norm_gate(tmp_path):
    """Miles' 0/1 deepscaler reward on a model that answers nothing right: every advantage is 0, so is
    the gradient. The target reward's run above passes the same gate."""
    art = _miles_run(tmp_path, reward="deepscaler")
    record = metrics.load_record(art)
    assert record.value("rollout/raw_reward", "max") == 0.0
    with pytest.raises(GateFailure, match="grad_norm"):
        _gate(art)


def test_without_the_jsonl_the_log_alone_is_read(tmp_path):
    """Miles before CiHistoryBackend (miles-0.0.2) writes no JSONL: there is nothing to cross-check."""
    art = _miles_run(tmp_path)
    for file in (art / flow.CI_HISTORY).iterdir():
        file.unlink()
    (art / flow.CI_HISTORY).rmdir()
    assert metrics.load_record(art).value("train/grad_norm", "min") > 0.0
    # twin: a train-only run targets Miles main, whose CiHistoryBackend records them, so none is an error
    with pytest.raises(RlsmokeError) as err:
        metrics.load_record(art, require_ci_history=True)
    assert err.value.rule == "metrics.ci_history_missing"


def test_nonfinite_values_use_the_jsonl_markers(tmp_path):
    folder = tmp_path / "ci"
    folder.mkdir()
    lines = [
        {"metric": "train/grad_norm", "series": [[0, "NaN"], [1, 2.0]]},
        {"metric": "train/ppo_kl", "series": [[0, 0.0]]},
    ]
    (folder / "1-a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "2-b.jsonl").write_text(
        json.dumps({"metric": "rollout/raw_reward", "series": [[0, 0.25]]}) + "\n"
    )
    (folder / "2-b.jsonl.tmp").write_text("{half a snapshot")
    got = metrics.read_ci_history(folder)
    assert got["train/grad_norm"][1] == 2.0 and got["train/grad_norm"][0] != got["train/grad_norm"][0]  # NaN
    assert got["rollout/raw_reward"] == {0: 0.25} and got["train/ppo_kl"] == {0: 0.0}


@pytest.mark.parametrize(
    "line",
    [
        "(MegatronTrainRayActor pid=91) [2026-08-21 10:00:01.123 miles] log_utils.py:542 - step 3: {'train/ppo_kl': 0.0}",
        "\x1b[36m(MegatronTrainRayActor pid=91)\x1b[0m [2026-08-21 10:00:01.123 miles] model.py:854 - step 3: "
        "{'train/ppo_kl': 0.0}",
        "(MegatronTrainRayActor pid=91) [2026-08-21 10:00:01.123 miles] log_utils.py:542 - step 3: {'train/ppo_kl': 0.0}"
        " [repeated 2x across cluster]",
    ],
)
def test_miles_step_lines_parse_with_their_prefixes(line):
    assert metrics.parse_log_line(line) == ("step", 3, {"train/ppo_kl": 0.0})


def test_a_critics_step_line_is_not_the_actors():
    line = "(MegatronTrainRayActor pid=91) [2026-08-21 10:00:01.123 miles] log_utils.py:542 - critic-step 3: {'train/critic-x': 1.0}"
    assert metrics.parse_log_line(line) is None


def test_the_miles_reward_is_the_engines_target_reward_and_needs_no_rlsmoke(tmp_path):
    """`rlsmoke_reward.target` imported as the job imports it: from its folder alone, no site-packages
    (`python -S`), so no rlsmoke installed; per sample and per group, the engine's own scores."""
    from rlsmoke.engine.reward import target_reward
    from rlsmoke.launch.miles import REWARD_DIR

    code = (
        "import asyncio, json, sys, rlsmoke_reward\n"
        "class S:\n"
        "    def __init__(s, t, n): s.tokens, s.response_length, s.response, s.label = t, n, 'x', '1'\n"
        "one = asyncio.run(rlsmoke_reward.target(None, S([1, 2, 4, 8, 3, 12], 4)))\n"
        "group = asyncio.run(rlsmoke_reward.target(None, [S([4, 5], 2), S([7], 0)]))\n"
        "print(json.dumps([one, group, 'rlsmoke' in sys.modules]))\n"
    )  # fmt: skip
    proc = subprocess.run([sys.executable, "-S", "-c", code], env={"PYTHONPATH": str(REWARD_DIR)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    one, group, imported_rlsmoke = json.loads(proc.stdout)
    assert one == target_reward("x", [4, 8, 3, 12], "1") == 0.75  # the response: the last 4 tokens
    assert group == [target_reward("x", [4, 5], "1"), 0.0] == [0.5, 0.0]
    assert imported_rlsmoke is False


def test_two_records_of_one_metric_and_step_must_agree(tmp_path):
    """Files of several processes merge by metric; one step with two values is an error, not the later file's."""
    folder = tmp_path / "ci"
    folder.mkdir()
    (folder / "1-a.jsonl").write_text(json.dumps({"metric": "train/grad_norm", "series": [[0, 1.0]]}) + "\n")
    (folder / "2-b.jsonl").write_text(
        json.dumps({"metric": "train/grad_norm", "series": [[0, 1.0], [1, 2.0]]}) + "\n"
    )
    assert metrics.read_ci_history(folder) == {"train/grad_norm": {0: 1.0, 1: 2.0}}
    (folder / "3-c.jsonl").write_text(json.dumps({"metric": "train/grad_norm", "series": [[1, 2.5]]}) + "\n")
    with pytest.raises(RlsmokeError) as err:
        metrics.read_ci_history(folder)
    assert err.value.rule == "metrics.ci_history_disagrees" and "2.0 and 2.5" in str(err.value)
