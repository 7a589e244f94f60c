"""A wheel carries what rlsmoke reads at run time, so an installed copy works without the checkout."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlsmoke.shipped import RUNTIME_FOLDERS

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_FILES = [
    "thresholds/builtin.json",
    "data/math.jsonl",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
    "fla_configs/NVIDIA_H200/provenance.json",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the tree (the build writes build/ and *.egg-info beside its sources)."""
    tree = tmp_path_factory.mktemp("tree")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("src", "fixtures"):
        shutil.copytree(ROOT / folder, tree / folder, symlinks=True, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, tree],
                   check=True, capture_output=True)  # fmt: skip
    return next(out.glob("rlsmoke-*.whl"))


def test_the_wheel_carries_the_runtime_data_and_no_test_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"rlsmoke/_fixtures/{f}" for f in RUNTIME_FILES} <= names
    assert {f.split("/")[0] for f in RUNTIME_FILES} == set(RUNTIME_FOLDERS)
    shipped = {n.split("/")[2] for n in names if n.startswith("rlsmoke/_fixtures/")}
    assert shipped == set(RUNTIME_FOLDERS)  # golden snapshots and HF configs stay with the tests
    # the reward a Miles job imports from the installed package's folder, and the rule it reads
    assert {"rlsmoke/engine/miles_reward/rlsmoke_reward.py", "rlsmoke/engine/reward.py"} <= names


@pytest.mark.slow
def test_an_installed_wheel_runs_a_case_away_from_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel], check=True,
                   capture_output=True)  # fmt: skip
    code = "import sys, rlsmoke; from rlsmoke.cli import main; print(rlsmoke.__file__); sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(site), "RLSMOKE_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-c", code, "run", "glm5-744b-a40b-4layer", "--platform", "cpu", "--out",
                          tmp_path / "run"], cwd=tmp_path, env=env, capture_output=True, text=True)  # fmt: skip
    assert run.stdout.startswith(str(site)), run.stdout  # the installed copy, not the checkout's
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "verdict: PASS" in run.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["thresholds"].startswith(str(site))


def test_the_package_version_is_pyproject_s():
    import tomllib

    import rlsmoke

    assert rlsmoke.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
