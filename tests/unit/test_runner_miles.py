"""The Miles launcher against a real Ray: `ray start --head`, `ray job submit`, then nothing left.

Miles itself is not installed here; its `train.py` is stood in for by a script that prints what
Miles' prints (`step N: {...}` lines) and the env and cwd it was given.
"""

import importlib.util
import os
import textwrap
from pathlib import Path

import pytest
from fake_miles import write_fake_miles
from procs import alive

from rlsmoke.cases import Case
from rlsmoke.errors import CheckpointError
from rlsmoke.launch.lease import GpuLease, lease_ports
from rlsmoke.platforms import Host
from rlsmoke.suite import Artifacts, gates_for, run_case

pytestmark = pytest.mark.background  # waits on Ray's job manager polls once a second

# find_spec, not importorskip: importing ray here would cost every `pytest --co` a second
HAS_RAY_DASHBOARD = all(importlib.util.find_spec(m) for m in ("ray", "aiohttp", "aiohttp_cors"))
needs_ray = pytest.mark.skipif(not HAS_RAY_DASHBOARD, reason="needs ray[default] (pip install -e .[dev])")

TRAIN = textwrap.dedent("""
    import os, sys
    print("ENV", os.getcwd(), os.environ.get("MASTER_PORT"), os.environ.get("CUDA_VISIBLE_DEVICES"),
          os.environ.get("NCCL_NVLS_ENABLE"), os.environ.get("https_proxy"), len(sys.argv), sys.argv[0])
    print("rollout 0: {'rollout/raw_reward': 0.25, 'rollout/entropy': 0.5, 'rollout/log_probs': -0.51, "
          "'rollout/rollout_log_probs': -0.5}")
    print("step 0: {'train/ppo_kl': 0.0, 'train/pg_clipfrac': 0.0, 'train/grad_norm': 1.5, "
          "'train/train_rollout_logprob_abs_diff': 0.01}")
""")


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
def test_miles_launch_on_real_ray_leaves_nothing(tmp_path, monkeypatch):
    miles = write_fake_miles(tmp_path / "miles", train=TRAIN)  # its parser accepts the launch (the pre-flight)
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    ports = lease_ports(start=7)
    art = Artifacts(tmp_path / "art", launcher="miles", host=Host("nvidia", "H200", 2), miles_root=miles,
                    lease=GpuLease("nvidia", ("0", "1")), ports=ports, timeout=240)  # fmt: skip
    case = Case("glm4.5-355b-a32b-4layer", platform="nvidia", num_gpus=2)
    record = run_case(case, art)
    ports.release()
    log = (art.path / "run.log").read_text()
    env_line = next(line for line in log.splitlines() if line.startswith("ENV"))
    assert env_line.split()[1:6] == [str(miles), str(ports.master), "0,1", "0", "None"], env_line
    assert "train.py" in env_line
    assert record.value("train/grad_norm") == 1.5 and record.value("rollout/raw_reward") == 0.25
    assert record.meta["launcher"] == "miles" and record.meta["platform"] == "nvidia"
    verdict = gates_for(case, art).check(record)  # Miles' gates (fixtures/thresholds/miles.json)
    assert {r.gate.name for r in verdict.results} >= {"logprob_mean_diff", "ppo_kl_step0", "pg_clipfrac_step0"}
    assert (art.path / "ray-head.log").is_file()
    # Ray's own logs are kept only when something failed: here the head ran until its stop
    # (the job's end must not sweep up the cluster's processes: they carry the head's token, not the job's).
    assert not (art.path / "ray-logs").exists()
    assert _processes_in(miles) == [], "Ray processes outlived the run"


def test_a_corrupt_checkpoint_fails_before_anything_launches(tmp_path):
    folder = tmp_path / "models" / "glm5-744b-a40b-4layer"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{not json")
    (folder / "model.safetensors").write_bytes(b"\x00" * 16)
    art = Artifacts(tmp_path / "art", model_dir=tmp_path / "models")
    with pytest.raises(CheckpointError, match="config.json"):
        run_case(Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True), art)
    assert sorted(p.name for p in art.path.iterdir()) == [], "something ran before the checkpoint was verified"
