"""The example nightly GPU workflow is valid (check-jsonschema's vendored GitHub schema, offline)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "nightly-gpu.yml"
CHECK = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which(
    "check-jsonschema"
)
needs_checker = pytest.mark.skipif(CHECK is None, reason="needs check-jsonschema (pip install -e .[dev])")


def _lint(path: Path) -> subprocess.CompletedProcess:
    # the vendored schema ships inside the package: no network
    return subprocess.run([CHECK, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@needs_checker
def test_workflow_is_valid():
    proc = _lint(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_checker
def test_the_linter_rejects_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("runs-on:", "runs_on:"))
    proc = _lint(broken)
    assert proc.returncode != 0 and "runs-on" in proc.stdout + proc.stderr


@pytest.mark.parametrize("needle", [
    "schedule:", "cron:", "pytest -m ${{ matrix.vendor }}", "vendor: nvidia", "vendor: rocm", "self-hosted",
    "NUM_GPUS: ${{ steps.gpus.outputs.num_gpus }}", "RLSMOKE_LEASE_DIR", "-n 2", "timeout-minutes:",
    "--junitxml", "actions/upload-artifact", "summary.md", "rlsmoke-history.db", "plots/*.png",
])  # fmt: skip
def test_workflow_has(needle):
    assert needle in WORKFLOW.read_text()
