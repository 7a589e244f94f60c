"""Miles' trainer alone (`--debug-train-only`) on the built-in engine's rollout file: the argv, the plan, the flow.

The flow runs end to end on CPU against a fake Miles checkout (miles_fake): the real torchrun runs its
converter, the built-in engine writes the rollout file, a real `ray start --head` runs, and the fake
`train.py` joins it, reads the file and logs Miles' metrics from a real forward of the checkpoint.
"""

import importlib.util
import json
import shlex

import pytest
import torch
from flag_table import FlagTable, refusals
from miles_fake import commands, write_root

from rlsmoke import miles_rollout
from rlsmoke.cases import Case
from rlsmoke.cli import main
from rlsmoke.errors import RlsmokeError
from rlsmoke.launch import train_only
from rlsmoke.launch.miles import Paths, flag_values

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs ray (pip install -e .[dev])"
)
GLM5, GLM45 = "glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer"


def _plan(name=GLM5, num_gpus=1):
    case = Case(name, platform="nvidia", num_gpus=num_gpus, target=train_only.TARGET)
    return train_only.make_plan(case, paths=Paths(output_dir="/runs/x"), out="/runs/x")


def _flags(launch) -> dict[str, list[str]]:
    return {f: v for toks in launch.groups.values() for f, v in flag_values(toks)}


@pytest.mark.parametrize("name", [GLM5, GLM45])
def test_the_train_only_argv_is_one_gpu_no_sglang_and_miles_main_accepts_it(name):
    tp = _plan(name)
    flags = _flags(tp.launch)
    assert tp.launch.argv[:2] == ["python3", "train.py"] and tp.launch.ray_num_gpus == 1
    assert (
        flags["--load-debug-rollout-data"] == ["/runs/x/rollout_data/{rollout_id}.pt"]
        and "--debug-train-only" in flags
    )
    assert flags["--attention-backend"] == ["fused"] and flags["--moe-token-dispatcher-type"] == ["alltoall"]
    assert flags["--num-rollout"] == ["1"] and flags["--actor-num-gpus-per-node"] == ["1"]
    dropped = {"--colocate", "--moe-enable-deepep", "--save", "--load", "--save-interval", "--dump-details"}
    assert not dropped & flags.keys()
    assert not [f for f in flags if f.startswith("--sglang-") or f == "--rollout-num-gpus-per-engine"]
    assert flags["--prompt-data"] == [str(train_only.PROMPT_DATA)]
    assert tp.launch.env["PYTHONPATH"].startswith(
        "/root/miles:"
    )  # Ray's workers import miles from the checkout
    assert refusals(tp.launch.argv[2:], FlagTable.of(train_only.TARGET)) == []
    # the twin: the launch it came from colocates and flash-attends, which a train-only GPU cannot
    assert {"--colocate", "--attention-backend"} <= _flags(tp.plan.launch).keys()
    assert _flags(tp.plan.launch)["--attention-backend"] == ["flash"]


def test_glm5_converts_with_its_spec_and_pads_for_the_dsa_top_k():
    tp = _plan(GLM5)
    convert = next(s for s in train_only.steps(tp) if s.name == "convert")
    spec = convert.command.index("--spec")
    assert convert.command[spec + 1 : spec + 3] == ("miles_plugins.models.glm5.glm5", "get_glm5_spec")
    assert convert.command[:4] == (
        "torchrun",
        "--nproc-per-node",
        "1",
        "/root/miles/tools/convert_hf_to_torch_dist.py",
    )
    assert _flags(tp.launch)["--data-pad-size-multiplier"] == ["4096"]
    assert "--spec" not in _flags(_plan(GLM45).launch)


def test_the_rollout_step_takes_the_shape_and_temperature_of_the_argv():
    tp = _plan(GLM5)
    rollout = next(s for s in train_only.steps(tp) if s.name == "rollout").command
    flags = _flags(tp.launch)
    got = dict(zip(rollout[4::2], rollout[5::2], strict=False))
    assert (
        got["--n-prompts"] == flags["--rollout-batch-size"][0]
        and got["--n-samples"] == flags["--n-samples-per-prompt"][0]
    )
    assert got["--temperature"] == flags["--rollout-temperature"][0] and got["--out"] == tp.rollout_template


def test_a_train_only_launch_on_two_gpus_is_refused():
    with pytest.raises(RlsmokeError) as err:
        _plan(GLM5, num_gpus=2)
    assert err.value.rule == "miles.train_only"


def test_plan_prints_the_convert_the_rollout_file_and_the_train_only_launch(capsys):
    assert (
        main(["plan", GLM5, "--platform", "nvidia", "--num-gpus", "1", "--launcher", "miles", "--train-only"])
        == 0
    )
    script = capsys.readouterr().out
    names = [line.split(":")[0][2:] for line in script.splitlines() if line.startswith("# ") and ":" in line]
    assert names == ["prepare", "convert", "rollout", "ray-head", "train"]
    assert "tools/convert_hf_to_torch_dist.py" in script and "rlsmoke.miles_rollout" in script
    assert "--include-dashboard=false" in script and "export RAY_ADDRESS=127.0.0.1:6379" in script
    assert "--debug-train-only --load-debug-rollout-data" in script and "ray job submit" not in script
    assert (
        main(["plan", GLM5, "--platform", "nvidia", "--num-gpus", "1", "--train-only", "--format", "json"])
        == 0
    )
    steps = json.loads(capsys.readouterr().out)["steps"]
    assert [s["name"] for s in steps] == names and steps[-1]["command"][:2] == ["python3", "train.py"]
    # the convert that `run` makes: without apex, as train.py (launch.train_only.NO_APEX)
    assert "--no-gradient-accumulation-fusion" in steps[1]["command"]
    # Miles' train actor is a worker of the head and reads the record dir in the head's env (seen on an H200:
    # the driver alone had it, and the CiHistory JSONL stayed empty)
    head, train = steps[3], steps[4]
    assert head["env"]["MILES_CI_GATE_RECORD_DIR"] == train["env"]["MILES_CI_GATE_RECORD_DIR"]
    assert "MILES_CI_GATE_RECORD_DIR=" in next(line for line in script.splitlines() if "ray start" in line)


@pytest.mark.parametrize(("extra", "rule"), [
    ([], "launcher.miles_root"),
    (["--inject", "stale-weights"], "miles.inject"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, rule):
    root = write_root(tmp_path / "miles") if extra else tmp_path / "nothing"
    code = main(["run", GLM5, "--launcher", "miles", "--train-only", "--miles-root", str(root), "--platform", "nvidia",
                 "--num-gpus", "1", "--out", str(tmp_path / "art"), *extra])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: [{rule}]") and len(err.strip().splitlines()) == 1
    assert not extra or commands(root) == []


def _run(tmp_path, root, out, *extra) -> int:
    return main(["run", GLM5, "--launcher", "miles", "--train-only", "--miles-root", str(root), "--platform", "nvidia",
                 "--num-gpus", "1", "--tiny", "--n-prompts", "2", "--n-samples", "4", "--max-response-len", "16",
                 "--out", str(out), "--model-dir", str(tmp_path / "models"), *extra])  # fmt: skip


@needs_ray
@pytest.mark.slow
def test_the_train_only_flow_runs_end_to_end_and_its_twin_fails_its_gate(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    root = write_root(tmp_path / "miles")
    # --repeat 2: one launch of two steps, step i on seed i's rollout; each step gated as its seed (two are
    # as many as three to tell one file per step from one file read twice, and are calibrate's --min-seeds)
    assert _run(tmp_path, root, tmp_path / "art", "--repeat", "2") == 0, capsys.readouterr()
    shown = capsys.readouterr().out
    assert "logprob_abs_diff" in shown and "verdict: PASS" in shown
    summary = json.loads((tmp_path / "art" / "summary.json").read_text())
    assert summary["launcher"] == "miles" and summary["mode"] == "train-only" and summary["verdict"] == "PASS"
    assert summary["rollout"]["samples"] == 8 and summary["rollout"]["temperature"] == 1.0
    assert summary["seeds"] == [0, 1] and summary["per_repeat_verdict"] == ["PASS"] * 2
    diffs = [seed["train/train_rollout_logprob_abs_diff"] for seed in summary["per_repeat"]]
    assert len(set(diffs)) == 2  # two rollouts, not one read twice
    recorded = commands(root)
    assert [c["kind"] for c in recorded] == ["convert", "train"]
    train = recorded[-1]
    assert train["argv"][0] == "train.py" and shlex.join(train["argv"]).count("--num-rollout 2") == 1
    assert train["env"]["MILES_CI_GATE_RECORD_DIR"] == str(tmp_path / "art" / "ci_history")
    files = [torch.load(tmp_path / "art" / "rollout_data" / f"{i}.pt", weights_only=False) for i in range(2)]
    assert [f["rollout_id"] for f in files] == [0, 1]
    assert list((tmp_path / "art" / "ci_history").glob("*.jsonl"))
    # step k of the launch is seed k's rollout, as a one-seed rollout of seed k writes it
    shape = ["--n-prompts", "2", "--n-samples", "4", "--max-response-len", "16", "--temperature", "1"]
    one = ["--out", str(tmp_path / "one" / "{rollout_id}.pt"), "--seed", "1", "--tiny"]
    data = ["--checkpoint", str(tmp_path / "models" / GLM5), "--prompt-data", str(train_only.PROMPT_DATA)]
    assert miles_rollout.main([GLM5, *shape, *one, *data]) == 0
    seed_1 = torch.load(tmp_path / "one" / "0.pt", weights_only=False)["samples"][0]["tokens"]
    assert seed_1 == files[1]["samples"][0]["tokens"] != files[0]["samples"][0]["tokens"]
    assert main(["calibrate", str(tmp_path / "art"), "--write", str(tmp_path / "cal" / "miles.json")]) == 0
    entry = json.loads((tmp_path / "cal" / "miles.json").read_text())["entries"][0]
    assert entry["provenance"]["runs"] == 2 and entry["key"]["launcher"] == "miles"

    # The twin, one seed: the file's log-probs are the raw logits' (T=1) while Miles divides by 0.7. Converted:
    # skipped.
    code = _run(
        tmp_path, root, tmp_path / "twin", "--rollout-temperature", "0.7", "--inject", "temperature-mismatch"
    )
    shown = capsys.readouterr().out
    assert code == 1 and "logprob_abs_diff: train/train_rollout_logprob_abs_diff" in shown, shown
    assert "convert: skipped" in (tmp_path / "twin" / "flow.log").read_text()
    assert [c["kind"] for c in commands(root)] == ["convert", "train", "train"]
    assert shlex.join(commands(root)[-1]["argv"]).count("--rollout-temperature 0.7") == 1
