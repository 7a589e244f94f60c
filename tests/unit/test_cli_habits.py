"""The command line's manners: --version, help that states each default, `cases` that describes,
`prepare` and `run` that spell the case and --tiny alike, and fixes written as flags, not Python.
"""

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from procs import run_cli

import rlsmoke

ROOT = Path(__file__).resolve().parents[2]
GLM5 = "glm5-744b-a40b-4layer"


@pytest.fixture
def rlsmoke_cli():
    """`rlsmoke ARGS`, run in this process."""

    def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return run_cli([sys.executable, "-m", "rlsmoke.cli", *args], env={**os.environ, **(env or {})}, timeout=120)  # fmt: skip

    return cli


def _flat(help_text: str) -> str:
    return re.sub(r"\s+", " ", help_text)


def test_version(rlsmoke_cli):
    out = rlsmoke_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rlsmoke {rlsmoke.__version__}"


def test_run_help_states_every_default(rlsmoke_cli):
    text = _flat(rlsmoke_cli("run", "--help").stdout)
    assert re.search(r"--platform PLATFORM nvidia \| rocm \| cpu \(default: detected", text), text
    assert "colocate on nvidia and cpu, async on rocm" in text
    for flag, default in (("--seed SEED", "0"), ("--rollout-temperature ROLLOUT_TEMPERATURE", "1.0"),
                          ("--n-samples N_SAMPLES", "on GPUs: seed 004's 8; on CPU: 4")):  # fmt: skip
        assert re.search(re.escape(flag) + r" [^-]*\(default " + re.escape(default) + r"\)", text), flag
    assert re.search(r"--prompt-data PROMPT_DATA [^-]*\(default [^)]*math\.jsonl", text), text


def test_plan_help_states_the_format_default(rlsmoke_cli):
    text = _flat(rlsmoke_cli("plan", "--help").stdout)
    assert re.search(r"--format \{shell,json\} [^-]*\(default shell\)", text), text


def test_run_detects_the_platform(tmp_path):
    """No --platform: the host's GPUs decide. A fake nvidia-smi with 8 H200s makes it an NVIDIA run."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "echo 'NVIDIA H200'\n" * 8)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run([sys.executable, "-m", "rlsmoke.cli", "run", GLM5, "--num-gpus", "16", "--out", str(tmp_path / "o")],
                         env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": ""},
                         capture_output=True, text=True, timeout=120)  # a fresh process: it detects its host once  # fmt: skip
    assert out.returncode == 2 and "platform=nvidia, but this host has 8 NVIDIA H200" in out.stderr, (
        out.stderr
    )


def test_cases_describe_each_case(rlsmoke_cli):
    from rlsmoke.models import MODEL_NAMES, model_spec

    lines = rlsmoke_cli("cases").stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(MODEL_NAMES)
    for name, line in zip(MODEL_NAMES, lines, strict=True):
        spec, tiny = model_spec(name), model_spec(name, tiny=True)
        assert f"{spec.num_layers} layers" in line and f"{spec.num_experts} experts" in line, line
        assert f"width {spec.hidden_size} (--tiny {tiny.hidden_size})" in line, line


@pytest.mark.parametrize("verb", ["prepare", "run"])
def test_prepare_and_run_spell_the_case_and_tiny_alike(rlsmoke_cli, verb):
    out = rlsmoke_cli(verb, "--help")
    text = _flat(out.stdout)
    assert re.search(r"usage: rlsmoke " + verb + r" .*\bCASE$", text.split(" positional arguments:")[0]), text
    assert "CASE case name (see `rlsmoke cases`)" in text
    assert "--tiny, --no-tiny the tiny width of the case" in text
    bad = rlsmoke_cli(verb, "no-such-case", "--tiny", "--out", "/nonexistent/x")
    assert bad.returncode == 2 and bad.stderr.startswith("error: [case.known] case='no-such-case' is unknown")


def test_readme_names_every_verb():
    from rlsmoke.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    verbs = build_parser()._subparsers._group_actions[0].choices
    assert [v for v in verbs if f"rlsmoke {v}" not in readme] == []


def test_fixes_name_flags_not_python_arguments(rlsmoke_cli, tmp_path):
    out = tmp_path / "ck"
    assert rlsmoke_cli("prepare", GLM5, "--tiny", "--out", str(out), "--no-progress").returncode == 0
    again = rlsmoke_cli("prepare", GLM5, "--tiny", "--out", str(out), "--no-progress")
    assert again.returncode == 2 and "[checkpoint.exists]" in again.stderr and "--force" in again.stderr
    assert not re.search(r"\w+=(True|False)", again.stderr), again.stderr


@pytest.mark.parametrize("num_gpus, head", [("8", None), ("16", "10.1.2.3")])
def test_plan_no_proxy_names_each_address_once(rlsmoke_cli, num_gpus, head):
    out = rlsmoke_cli(
        "plan", GLM5, "--platform", "nvidia", "--num-gpus", num_gpus, *(["--head-addr", head] if head else [])
    )
    no_proxy = next(line for line in out.stdout.splitlines() if line.startswith("export no_proxy="))
    hosts = no_proxy.split("=", 1)[1].split(",")
    assert len(hosts) == len(set(hosts)) and hosts[0] == "127.0.0.1" and (head is None or head in hosts), (
        no_proxy
    )
