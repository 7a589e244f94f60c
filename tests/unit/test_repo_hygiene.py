"""The checkout itself: what is committed, what is ignored, and what the thresholds' provenance cites."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)


def test_nothing_committed_where_a_venv_goes():
    """`python3 -m venv .venv` must work on a fresh clone: no file may sit at that path."""
    tracked = _git("ls-files", "--", ".venv", ".venv-ci", ".tox").stdout.split()
    assert tracked == []


@pytest.mark.parametrize("path", ["rlsmoke-runs/glm5-744b-a40b-4layer/20260101-120000/run.log", ".venv/bin/python",
                                  ".venv", "artifacts/x"])  # fmt: skip
def test_what_a_run_writes_is_ignored(path):
    """`rlsmoke run`'s default --out, a venv (and tox's `.venv` file), the suite's artifacts: none shows up in
    `git status`."""
    assert _git("check-ignore", "--no-index", "-q", path).returncode == 0, f"{path} is not ignored"


def test_the_provenance_cites_what_exists():
    """Every file named in builtin.json exists, and every `rlsmoke VERB` it names is a real subcommand."""
    from rlsmoke.cli import build_parser

    text = (ROOT / "fixtures/thresholds/builtin.json").read_text()
    json.loads(text)
    files = set(re.findall(r"`((?:bench|src|tests|docs|fixtures)/[^`\s]+)`", text))
    missing = [f for f in files if not (ROOT / f).exists()]
    assert not missing, f"builtin.json cites missing files: {missing}"
    verbs = set(re.findall(r"\brlsmoke ([a-z]+)\b", text))
    known = set(build_parser()._subparsers._group_actions[0].choices)
    assert verbs and verbs <= known, verbs - known


def test_ci_runs_the_readme_s_test_command_and_plain_pytest_stays_serial():
    """xdist is the fast path by name; `-n` in addopts would take `--pdb` and `breakpoint()` away."""
    import tomllib

    quick = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    command = next(line.split("#")[0].strip() for line in quick.splitlines() if line.startswith("pytest"))
    assert command.startswith("pytest -n auto --dist ")
    assert f"\n{command}\n" in (ROOT / ".ci/run").read_text()
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert not re.search(r"(^|\s)(-n|--numprocesses|--dist)\b", addopts), addopts
