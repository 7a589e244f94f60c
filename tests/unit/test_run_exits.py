"""How `rlsmoke run` ends when it cannot finish: bad --out, a used --out, a corrupt --checkpoint.

Bad input is one `error:` line and exit 2 (the cause also in run.log when there is one). Interrupts:
test_run_signals.py; inputs refused before loading: test_bad_inputs.py.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from procs import run_cli

from rlsmoke.errors import ExitCode

CASE = "glm4.5-355b-a32b-4layer"


@pytest.fixture
def rlsmoke_run():
    """`rlsmoke run CASE --platform cpu ARGS`, run in this process."""

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", *args]
        return run_cli(argv, env=os.environ, timeout=timeout)

    return run


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: ["), err
    return err


@pytest.mark.parametrize("out", ["/proc/forbidden/run", "/etc/passwd"])
def test_an_unwritable_out_is_one_error_line(rlsmoke_run, out):
    err = _one_error_line(rlsmoke_run("--out", out))
    assert "[run.out]" in err and out in err and "--out" in err


def test_a_truncated_shard_is_one_error_line_and_in_run_log(rlsmoke_run, tmp_path):
    from rlsmoke.checkpoints import prepare

    ckpt = tmp_path / "ckpt"
    src = Path(prepare(CASE, tiny=True))
    ckpt.mkdir()
    for f in src.iterdir():
        (ckpt / f.name).write_bytes(f.read_bytes())
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    out = tmp_path / "out"
    err = _one_error_line(rlsmoke_run("--checkpoint", str(ckpt), "--out", str(out)))
    assert shard.name in err
    log = (out / "run.log").read_text()
    assert shard.name in log.splitlines()[-1] and "error:" in log.splitlines()[-1], log


def test_an_out_with_an_earlier_run_is_refused_unless_overwrite(rlsmoke_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    earlier = '{"verdict": "PASS"}\n'
    (out / "summary.json").write_text(earlier)
    err = _one_error_line(rlsmoke_run("--out", str(out)))
    assert "[run.out_used]" in err and "summary.json" in err and "--overwrite" in err, err
    assert (out / "summary.json").read_text() == earlier and not (out / "run.log").exists()

    (out / "run.log").write_text("an earlier run\n")
    proc = rlsmoke_run("--out", str(out), "--overwrite")
    assert proc.returncode == ExitCode.OK, proc.stderr[-3000:]
    log = (out / "run.log").read_text()
    assert "an earlier run" not in log and (out / "summary.json").read_text() != earlier
    # run.log keeps what the terminal showed: the header that names the trainer, the gates, the verdict
    header = next(line for line in proc.stdout.splitlines() if line.startswith(CASE))
    assert "trainer=fsdp" in header and header in log, log
    table = proc.stdout[proc.stdout.index("\ngate ") + 1 : proc.stdout.index("\nverdict: ")].splitlines()
    assert len(table) > 5 and all(row in log.splitlines() for row in table), log
    assert log.splitlines()[-1] == "verdict: PASS", log


def test_the_default_out_is_a_new_folder_per_run(tmp_path):
    from rlsmoke.artifacts import default_out

    first = default_out(CASE, tmp_path)
    assert first.parent == tmp_path / CASE and re.fullmatch(r"\d{8}-\d{6}", first.name), first
    first.mkdir(parents=True)
    second = default_out(CASE, tmp_path)
    assert second != first and second.parent == first.parent and not second.exists()
