"""Records are one run's, complete or absent: a run holds its --out by a lock, writes each record whole,
replaces an earlier run's records (--overwrite) only once its own are complete, and says a full disk in
one `disk.full` line with exit 2.
"""

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from procs import ForkedCli, limit_file_size

from rlsmoke.artifacts import LOCK_NAME, RECORDS, RunFolder, write_atomic
from rlsmoke.errors import ExitCode, RlsmokeError

CASE = "glm4.5-355b-a32b-4layer"


def rlsmoke_run(out, *argv: str, setup=None, stdout=None):
    """`rlsmoke run` into `out`, forked with the engine imported; `setup` is called in the child first
    (a file-size limit, a patched function)."""
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--out", str(out), *argv]
    return ForkedCli(argv, setup=setup, stdout=stdout)  # its output not beside --out: a full disk


def finished(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.strip()


def one_error_line(err: str, rule: str) -> None:
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith(f"error: [{rule}]"), err


def earlier_records(out) -> dict[str, str]:
    """An earlier run's records in `out`, as a run that must not replace them finds them."""
    out.mkdir()
    earlier = {"summary.json": '{"verdict": "PASS", "earlier": true}\n', "metrics.jsonl": '{"earlier": 1}\n',
               "run.log": "an earlier run\n"}  # fmt: skip
    for name, text in earlier.items():
        (out / name).write_text(text)
    return earlier


def leftovers(folder) -> list[str]:
    """What a run must never leave: a temporary record, its lock, a staging sibling."""
    return sorted(p.name for p in [*folder.iterdir(), *folder.parent.iterdir()]
                  if p.name.endswith(".tmp") or p.name == LOCK_NAME or p.name.endswith(".rlsmoke-new"))  # fmt: skip


@pytest.fixture(autouse=True)
def prepared_checkpoint():
    """The cached checkpoint, built before any run here races for it or runs out of room (a cache hit
    after the first: per test, so that the module's tests need not share a worker)."""
    from rlsmoke.checkpoints import prepare

    prepare(CASE, tiny=True)


def test_records_are_one_runs_complete_or_absent_two_runs_into_one_out(tmp_path):
    out = tmp_path / "D"
    first, second = rlsmoke_run(out), rlsmoke_run(out)
    ends = sorted([finished(first), finished(second)])
    (ok, _), (refused, err) = ends
    assert (ok, refused) == (ExitCode.OK, ExitCode.USAGE), ends
    one_error_line(err, "run.out_locked")
    assert sorted(p.name for p in out.iterdir()) == sorted(RECORDS) and not leftovers(out)
    log = (out / "run.log").read_text()
    assert log.count("verdict: ") == 1 and log.count("config: ") == 1, log
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert summary["verdict"] == "PASS" and len(lines) == 2 * summary["shape"]["num_rollout"], lines


def test_records_are_one_runs_complete_or_absent_a_held_out_is_refused_untouched(tmp_path):
    out = tmp_path / "D"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with RunFolder(out):
        code, err = finished(rlsmoke_run(out, "--overwrite"), timeout=60)  # refused at once: it never waits
        assert code == ExitCode.USAGE, err
        one_error_line(err, "run.out_locked")
        assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != LOCK_NAME} == before
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_records_are_one_runs_complete_or_absent_an_interrupted_overwrite_keeps_the_earlier_records(tmp_path):
    out, earlier = tmp_path / "D", earlier_records(tmp_path / "D")
    proc = rlsmoke_run(out, "--overwrite")
    staged = out / ".rlsmoke-new" / "run.log"
    deadline = time.monotonic() + 240
    while not (staged.is_file() and "config: " in staged.read_text()) and proc.poll() is None:
        assert time.monotonic() < deadline, "the run never began"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # the new run has begun writing: its records are not complete
    code, err = finished(proc)
    assert code == ExitCode.INTERRUPTED_SIGTERM, err
    assert {p.name: p.read_text() for p in out.iterdir()} == earlier and not leftovers(out)


def test_records_are_one_runs_complete_or_absent_an_overwrite_replaces_them_once_complete(tmp_path):
    out = tmp_path / "D"
    out.mkdir()
    (out / "summary.json").write_text('{"earlier": true}\n')
    (out / "run.log").write_text("an earlier run\n")
    code, err = finished(rlsmoke_run(out, "--overwrite"))
    assert code == ExitCode.OK, err
    summary = json.loads((out / "summary.json").read_text())
    assert "earlier" not in summary and summary["artifacts"] == str(out) and summary["verdict"] == "PASS"
    assert sorted(p.name for p in out.iterdir()) == sorted(RECORDS) and not leftovers(out)


@pytest.mark.parametrize("room", [1000, 5000])  # bytes a file may take: run.log, then the gated summary.json
def test_records_are_one_runs_complete_or_absent_no_room_is_one_disk_full_line(tmp_path, room):
    out = tmp_path / "D"
    code, err = finished(rlsmoke_run(out, setup=functools.partial(limit_file_size, room), stdout=os.devnull))
    assert code == ExitCode.USAGE, err
    one_error_line(err, "disk.full")
    assert str(out) in err and not leftovers(out), err


def _mount_tmpfs(where, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0  # fmt: skip


def test_records_are_one_runs_complete_or_absent_a_full_tmpfs_is_one_disk_full_line(tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "64k"):
        pytest.skip("mounting a small tmpfs needs root; the file-size limit above covers the same writes")
    try:
        (disk / "filler").write_bytes(
            bytes(52 * 1024)
        )  # 12 KiB left: run.log and metrics fit, the summary not
        code, err = finished(rlsmoke_run(disk / "D"))
        assert code == ExitCode.USAGE, err
        one_error_line(err, "disk.full")
        assert not leftovers(disk / "D")
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_write_atomic_leaves_the_earlier_file_and_no_temporary_on_failure(tmp_path):
    record = tmp_path / "summary.json"
    record.write_text('{"earlier": true}\n')
    with pytest.raises(UnicodeEncodeError):
        write_atomic(record, '{"half": "\ud800"}')  # fails while writing, after the temporary was opened
    assert record.read_text() == '{"earlier": true}\n' and os.listdir(tmp_path) == ["summary.json"]


def test_a_run_folder_refuses_a_second_holder(tmp_path):
    with RunFolder(tmp_path / "D"), pytest.raises(RlsmokeError, match=r"in use by another run"):
        RunFolder(tmp_path / "D").__enter__()
    assert not (tmp_path / "D" / LOCK_NAME).exists()


# A SIGTERM that lands while a finalizer runs: Python prints the handler's exception and carries on, as
# it does for any exception raised in a __del__ (seen once in CI, inside regex's Group.__del__).
class StopsWhenCollected:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside the finalizer


def stop_in_a_finalizer() -> None:
    """In the run's process, before the CLI: a SIGTERM raised inside a finalizer once the run's step is done."""
    from rlsmoke.engine import run

    one_run = run.one_run

    def stopped_in_a_finalizer(*args, **kwargs):
        lines = one_run(*args, **kwargs)
        StopsWhenCollected()  # collected at once: the SIGTERM's exception is swallowed
        return lines

    run.one_run = stopped_in_a_finalizer


def test_a_stop_whose_exception_a_finalizer_swallowed_still_stops_the_run_and_keeps_the_earlier_records(
    tmp_path,
):
    out, earlier = tmp_path / "D", earlier_records(tmp_path / "D")
    code, err = finished(rlsmoke_run(out, "--overwrite", setup=stop_in_a_finalizer))
    assert "Exception ignored" in err, err  # the exception was swallowed where it was raised
    assert code == ExitCode.INTERRUPTED_SIGTERM, err
    assert {p.name: p.read_text() for p in out.iterdir()} == earlier and not leftovers(out)
