"""The Miles launcher's whole flow against a real Ray: convert, `ray start --head`, `ray job submit`, then nothing left.

Miles itself is not installed here: a fake checkout (miles_fake) stands in, whose converter runs under
the real torchrun and whose `train.py` runs under a real `ray job submit`; each records its command, as
Miles' own command recorder does, and `train.py` logs and writes its CI JSONL as Miles does.
"""

import importlib.util
import os
from pathlib import Path

import pytest
from fake_miles import write_fake_miles
from miles_fake import commands, write_root
from procs import alive

from rlsmoke.cases import Case
from rlsmoke.errors import CheckpointError, RlsmokeError
from rlsmoke.launch import flow
from rlsmoke.launch.miles import Paths
from rlsmoke.platforms import Host
from rlsmoke.processes.lease import GpuLease, lease_ports
from rlsmoke.suite import Artifacts, gates_for, run_case

# find_spec, not importorskip: importing ray here would cost every `pytest --co` a second
HAS_RAY_DASHBOARD = all(importlib.util.find_spec(m) for m in ("ray", "aiohttp", "aiohttp_cors"))
needs_ray = pytest.mark.skipif(not HAS_RAY_DASHBOARD, reason="needs ray[default] (pip install -e .[dev])")

CASE = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=2)  # Miles' own 2-GPU CI test of this model


def _model_dir(tmp_path) -> Path:
    """A model dir holding a real (tiny, cached) prepared checkpoint of CASE: the flow's first step, done."""
    from rlsmoke.checkpoints import prepare

    models = tmp_path / "models"
    models.mkdir()
    (models / CASE.name).symlink_to(prepare(CASE.name, tiny=True))
    return models


def _artifacts(folder, miles, models, ports) -> Artifacts:
    return Artifacts(folder, launcher="miles", host=Host("nvidia", "H200", 2), miles_root=miles, model_dir=models,
                     lease=GpuLease("nvidia", ("0", "1")), ports=ports, timeout=240)  # fmt: skip


def _processes_in(folder: Path) -> list[int]:
    """Live processes whose cwd is `folder`: Ray's daemons inherit the cwd of `ray start`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") == str(folder):
                if alive(entry):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@needs_ray
@pytest.mark.slow
def test_the_whole_miles_flow_on_real_ray(tmp_path, monkeypatch):
    miles = write_root(tmp_path / "miles")
    models = _model_dir(tmp_path)
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    ports = lease_ports(start=7)
    art = _artifacts(tmp_path / "art", miles, models, ports)
    record = run_case(CASE, art)
    gates_for(CASE, art).check(
        record
    )  # Miles' gates (fixtures/thresholds/miles.json), grad_norm > 0 among them

    paths = Paths(model_dir=str(models), output_dir=str(art.path / "miles"), miles_root=str(miles))
    plan = CASE.plan(paths=paths)
    convert, ray_head, submit = flow.steps(plan, paths)[1:]
    recorded = commands(miles)
    assert [c["kind"] for c in recorded] == ["convert", "convert", "train"]  # convert, then train: in order
    # the converter: under torchrun, one command per rank, as the plan renders it
    assert sorted((c["rank"], c["world_size"]) for c in recorded[:2]) == [(0, 2), (1, 2)]
    assert convert.command[:3] == ("torchrun", "--nproc-per-node", "2")
    assert all(c["argv"] == list(convert.command[4:]) for c in recorded[:2])
    assert recorded[0]["env"]["PYTHONPATH"].startswith(f"{miles}:")
    torch_dist = models / f"{CASE.name}_torch_dist"
    assert (torch_dist / flow.TRACKER).read_text() == flow.RELEASE
    # the job: Ray's head with the plan's GPUs, the plan's argv in the checkout, the run's env
    assert (
        "--num-gpus 2" in " ".join(ray_head.command)
        and "--num-gpus 2" in (art.path / "ray-head.log").read_text()
    )
    train = recorded[2]
    assert (
        ["python3", *train["argv"]]
        == plan.launch.argv
        == list(submit.command[submit.command.index("--") + 1 :])
    )
    assert train["cwd"] == str(miles)
    assert train["env"]["MASTER_PORT"] == str(ports.master) and train["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert train["env"]["NCCL_NVLS_ENABLE"] == "0" and train["env"]["https_proxy"] is None
    assert train["env"][flow.RECORD_DIR_VAR] == str(art.path / flow.CI_HISTORY)
    # the reward came from rlsmoke_reward on the job's PYTHONPATH, and gave the step a gradient
    assert "--custom-rm-path" in train["argv"] and str(Paths().reward_dir) in train["env"]["PYTHONPATH"]
    assert record.value("train/grad_norm", "min") > 0.0
    assert {r.gate.name for r in gates_for(CASE, art).verdict(record).results} >= {
        "grad_norm",
        "ppo_kl_step0",
    }
    # Ray's own logs are kept only when something failed: here the head ran until its stop
    assert not (art.path / "ray-logs").exists()
    assert _processes_in(miles) == [], "Ray processes outlived the run"
    ports.release()
    # Its twins need no second cluster: a JSONL that disagrees with the log fails the record's read
    # (test_miles_metrics), and a converted checkpoint skips the converter (test_miles_train_only: one convert)


def test_a_half_converted_checkpoint_is_refused_before_anything_starts(tmp_path):
    """A torch_dist folder with shards but no `release` tracker: the converter stopped half-way."""
    miles = write_root(tmp_path / "miles")
    models = _model_dir(tmp_path)
    (models / f"{CASE.name}_torch_dist" / "release").mkdir(parents=True)
    art = Artifacts(tmp_path / "art", launcher="miles", host=Host("nvidia", "H200", 2), miles_root=miles,
                    model_dir=models, timeout=60)  # fmt: skip
    import rlsmoke.suite

    with pytest.raises(RlsmokeError) as err:
        flow.check(CASE.plan(paths=Paths(model_dir=str(models), miles_root=str(miles))))
    assert err.value.rule == "miles.torch_dist" and "is missing" in str(err.value)
    with pytest.raises(RlsmokeError, match="a conversion that did not finish"):
        rlsmoke.suite.run_case(CASE, art)
    assert commands(miles) == [] and not (art.path / "ray-head.log").exists()
    # the twin: once the tracker reads release the same folder is taken as converted
    (models / f"{CASE.name}_torch_dist" / flow.TRACKER).write_text(flow.RELEASE)
    assert flow.torch_dist_done(models / f"{CASE.name}_torch_dist")


def test_a_flag_the_users_miles_refuses_stops_the_flow_before_the_conversion(tmp_path):
    """The pre-flight opens the flow: the user's Miles lacks a rendered flag, so nothing is converted or started."""
    miles = write_root(tmp_path / "miles")
    write_fake_miles(miles, refuse=("--custom-rm-path",))
    art = Artifacts(tmp_path / "art", launcher="miles", host=Host("nvidia", "H200", 2), miles_root=miles,
                    model_dir=_model_dir(tmp_path), timeout=60)  # fmt: skip
    with pytest.raises(RlsmokeError) as err:
        run_case(CASE, art)
    assert err.value.rule == "miles.flags" and "--custom-rm-path" in str(err.value)
    assert commands(miles) == [] and not (art.path / "convert.log").exists()
    assert not (art.path / "ray-head.log").exists()


def test_no_hf_checkpoint_is_refused_before_anything_starts(tmp_path):
    """Without --model-dir the flow looks where Miles does; nothing there: the prepare step was not done."""
    miles = write_root(tmp_path / "miles")
    plan = CASE.plan(paths=Paths(model_dir=str(tmp_path / "models"), miles_root=str(miles)))
    with pytest.raises(RlsmokeError) as err:
        flow.check(plan)
    assert (
        err.value.rule == "checkpoint.missing"
        and f"rlsmoke prepare {CASE.name} --out" in err.value.one_line()
    )
    assert commands(miles) == []


def test_a_corrupt_checkpoint_fails_before_anything_launches(tmp_path):
    folder = tmp_path / "models" / "glm5-744b-a40b-4layer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{not json")
    (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    art = Artifacts(tmp_path / "art", model_dir=tmp_path / "models")
    with pytest.raises(CheckpointError, match="config.json"):
        run_case(Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True), art)
    assert sorted(p.name for p in art.path.iterdir()) == [], (
        "something ran before the checkpoint was verified"
    )


@pytest.mark.parametrize(("asked", "named"), [
    ({"inject": "stale-weights"}, "inject='stale-weights'"),
    ({"rollout_temperature": 0.8}, "rollout_temperature=0.8"),
    ({"variants": ("clean", "stale-weights")}, "variants=('clean', 'stale-weights')"),
])  # fmt: skip
def test_what_only_the_built_in_engine_runs_is_refused_under_miles_by_name(tmp_path, asked, named):
    """A fault, a rollout temperature or shared variants under the Miles launcher: refused before anything
    launches, the error naming what was asked. Twin: without it the same launch plans."""
    from rlsmoke.suite import plan_launch

    miles = write_root(tmp_path / "miles")
    art = Artifacts(tmp_path / "art", launcher="miles", host=Host("nvidia", "H200", 2), miles_root=miles,
                    model_dir=_model_dir(tmp_path), timeout=60)  # fmt: skip
    with pytest.raises(RlsmokeError) as err:
        plan_launch(CASE, art, **asked)
    assert err.value.rule == "launcher.inject" and str(err.value).startswith(
        f"{named} needs the built-in engine"
    )
    assert plan_launch(CASE, art).launcher == "miles"
    assert commands(miles) == []
