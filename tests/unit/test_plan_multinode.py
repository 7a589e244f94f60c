"""A plan that spans nodes: the head's address comes from --head-addr or MASTER_ADDR, and the script
starts Ray on every node (head or joining worker, by NODE_RANK) before the head launches the job.
"""

import json
import os
import stat
import subprocess
import sys

import pytest

FLASH = "glm5.3-flash"
THREE_NODES = ["plan", FLASH, "--platform", "nvidia", "--num-gpus", "24"]


def rlsmoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "MASTER_ADDR"}
    return subprocess.run([sys.executable, "-m", "rlsmoke.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})})  # fmt: skip


def test_without_a_head_address_a_multi_node_plan_is_refused_with_the_fix():
    out = rlsmoke(*THREE_NODES)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: [plan.head_addr]") and "3 nodes" in out.stderr, out.stderr
    assert "--head-addr" in out.stderr and "MASTER_ADDR" in out.stderr


def test_a_loopback_head_cannot_serve_other_nodes():
    out = rlsmoke(*THREE_NODES, "--head-addr", "127.0.0.1")
    assert out.returncode == 2 and "[plan.head_addr]" in out.stderr


@pytest.mark.parametrize("how", ["option", "env"])
def test_the_head_address_reaches_every_node(how):
    args, env = (["--head-addr", "10.1.2.3"], None) if how == "option" else ([], {"MASTER_ADDR": "10.1.2.3"})
    out = rlsmoke(*THREE_NODES, *args, "--format", "json", env=env)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["env"]["MASTER_ADDR"] == "10.1.2.3" and plan["env"]["no_proxy"] == "127.0.0.1,10.1.2.3"
    nodes = plan["nodes"]
    assert [n["rank"] for n in nodes] == [0, 1, 2] and [n["role"] for n in nodes] == [
        "head",
        "worker",
        "worker",
    ]
    assert nodes[0]["command"][:5] == ["ray", "start", "--head", "--node-ip-address", "10.1.2.3"]
    for node in nodes[1:]:
        assert node["command"][:4] == ["ray", "start", "--address", "10.1.2.3:6379"]


@pytest.fixture
def script_run(tmp_path):
    """Runs the rendered shell script with `ray`, `python3`, `rlsmoke` and `torchrun` on PATH that print what
    they were given."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("ray", "python3", "rlsmoke", "torchrun"):
        exe = bindir / tool
        exe.write_text(f'#!/bin/sh\necho "{tool} $*"\n')
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    out = rlsmoke(*THREE_NODES, "--head-addr", "10.1.2.3")
    assert out.returncode == 0, out.stderr
    assert "127.0.0.1,127.0.0.1" not in out.stdout
    script = tmp_path / "launch.sh"
    script.write_text(out.stdout)

    def run(node_rank: str | None) -> subprocess.CompletedProcess:
        env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
        if node_rank is not None:
            env["NODE_RANK"] = node_rank
        return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=30)

    return run


def test_the_script_starts_the_head_then_the_job_on_node_0(script_run):
    lines = script_run("0").stdout.splitlines()
    assert lines[0].startswith("ray start --head --node-ip-address 10.1.2.3 --num-gpus 8")
    assert lines[1].startswith("rlsmoke prepare ") and lines[2].startswith("torchrun --nproc-per-node 8 ")
    assert lines[3].startswith("python3 train.py") and len(lines) == 4


def test_the_script_joins_the_head_on_the_other_nodes(script_run):
    done = script_run("2")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ray start --address 10.1.2.3:6379 --num-gpus 8"), lines


def test_the_script_asks_for_its_node_rank(script_run):
    done = script_run(None)
    assert done.returncode != 0 and done.stdout == "" and "NODE_RANK" in done.stderr


def test_a_single_node_plan_keeps_loopback_and_no_node_list():
    out = rlsmoke("plan", "glm5-744b-a40b-4layer", "--platform", "nvidia", "--num-gpus", "8", "--format", "json",
                  env={"MASTER_ADDR": "10.9.9.9"})  # fmt: skip
    plan = json.loads(out.stdout)
    assert plan["env"]["MASTER_ADDR"] == "127.0.0.1" and "nodes" not in plan
