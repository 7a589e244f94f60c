"""How `rlsmoke run` ends when it cannot finish: bad --out, a corrupt --checkpoint, a SIGTERM.

Bad input is one `error:` line and exit 2 (the cause also in run.log when there is one); a SIGTERM
stops the Ray cluster the run started, writes "interrupted" to run.log and exits 143.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import alive, descendants

from rlsmoke.errors import ExitCode

CASE = "glm4.5-355b-a32b-4layer"
INTERRUPTED = 143  # 128 + SIGTERM, as the README's exit-code table says


def rlsmoke_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith("error: ["), err
    return err


@pytest.mark.parametrize("out", ["/proc/forbidden/run", "/etc/passwd"])
def test_an_unwritable_out_is_one_error_line(out):
    err = _one_error_line(rlsmoke_run("--out", out))
    assert "[run.out]" in err and out in err and "--out" in err


def test_a_truncated_shard_is_one_error_line_and_in_run_log(tmp_path):
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


def test_sigterm_during_an_async_run_stops_ray_and_says_interrupted(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--mode", "async",
                             "--num-gpus", "2", "--num-rollout", "8", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while "rollout 0:" not in ((out / "run.log").read_text() if (out / "run.log").exists() else ""):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the async run never reached its first rollout"
            time.sleep(0.2)
        started = descendants(proc.pid)
        assert started, "the async run started no Ray processes"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == INTERRUPTED, (proc.returncode, stderr[-3000:])
    assert "Traceback" not in stderr and "SIGTERM" in stderr
    assert stderr.strip().splitlines()[-1].startswith("error: interrupted"), stderr[-3000:]
    assert (out / "run.log").read_text().splitlines()[-1].split("] ", 1)[1].startswith("interrupted")
    deadline = time.monotonic() + 30
    while [p for p in started if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in started if alive(p)], "Ray processes outlived the run"
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
