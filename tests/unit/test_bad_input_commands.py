"""Every subcommand ends bad input the same way: exit 2 and one `error: [rule] ... Fix: ...` line, never a
traceback or exit 1 (a failed gate); an unexpected exception is exit 3 with its traceback in a log."""

import os
import re
import sqlite3
from pathlib import Path

import pytest

from rlsmoke.cli import main
from rlsmoke.errors import ExitCode

CASE = "glm5-744b-a40b-4layer"
LONG = "y" * 300  # one path component past any file system's 255 bytes


def refused(capsys, argv: list[str], rule: str) -> str:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # a usage error: argparse exits
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE, (code, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: [{rule}] ") and ". Fix: " in err, err
    return err


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSMOKE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLSMOKE_THRESHOLDS_DIR", raising=False)


# --- a name too long, in each command (E6, X12-X18) ---------------------------------------------


@pytest.mark.parametrize("argv", [
    ["run", CASE, "--platform", "cpu", "--out", "{tmp}/" + LONG],
    ["run", CASE, "--platform", "cpu", "--checkpoint", "{tmp}/" + LONG],
    ["run", CASE, "--platform", "cpu", "--prompt-data", "{tmp}/" + LONG + ".jsonl"],
    ["prepare", CASE, "--tiny", "--out", "{tmp}/" + LONG],
    ["verify", "{tmp}/" + LONG],
    ["calibrate", "{tmp}/" + LONG],
    ["report", "--history", "{tmp}/" + LONG],
])  # fmt: skip
def test_a_name_too_long_is_one_line_in_every_command(tmp_path, capsys, argv):
    refused(capsys, [a.format(tmp=tmp_path) for a in argv], "path.too_long")


def test_a_thresholds_dir_with_a_name_too_long_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(tmp_path / LONG))
    refused(capsys, ["run", CASE, "--platform", "cpu", "--out", tmp_path / "o"], "path.too_long")


# --- the environment's folders (E1c, E1d) and a deleted working folder (E4b-d) --------------------


@pytest.mark.parametrize("command", [["run", CASE, "--platform", "cpu"], ["prepare", CASE, "--tiny"]])
def test_a_cache_that_is_a_file_is_one_line_before_anything_loads(tmp_path, capsys, monkeypatch, command):
    cache = tmp_path / "cachefile"
    cache.write_text("")
    monkeypatch.setenv("RLSMOKE_CACHE", str(cache))
    err = refused(capsys, [*command, "--out", tmp_path / "o"], "path.kind")
    assert "RLSMOKE_CACHE=" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", [["run", CASE, "--platform", "cpu"], ["prepare", CASE, "--tiny"]])
def test_a_deleted_working_folder_is_named_and_leaves_no_lock(tmp_path, capsys, monkeypatch, command):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    out = tmp_path / "o"
    refused(capsys, [*command, "--out", out], "path.cwd_gone")
    assert not out.exists()


# --- wrong kinds of path (X2, X3, M2, M3, H8) ----------------------------------------------------


@pytest.mark.parametrize("make, kind", [(os.mkfifo, "a FIFO"), (None, "a device")])
def test_a_fifo_or_device_as_prompt_data_is_the_wrong_kind_not_missing(tmp_path, capsys, make, kind):
    data = Path("/dev/zero") if make is None else tmp_path / "fifo"
    if make is not None:
        make(data)
    err = refused(capsys, ["run", CASE, "--platform", "cpu", "--out", tmp_path / "o", "--prompt-data", data],
                  "path.kind")  # fmt: skip
    assert kind in err and "missing" not in err


@pytest.mark.parametrize("name, rule", [("afile", "path.kind"), ("nowhere", "path.missing")])
def test_check_miles_on_a_file_or_a_missing_folder(tmp_path, capsys, name, rule):
    (tmp_path / "afile").write_text("")
    refused(
        capsys,
        ["plan", CASE, "--platform", "nvidia", "--num-gpus", "8", "--check-miles", tmp_path / name],
        rule,
    )


def test_plan_diff_names_the_targets_it_also_takes(capsys):
    from rlsmoke.targets import TARGETS

    err = refused(
        capsys, ["plan", CASE, "--platform", "nvidia", "--num-gpus", "8", "--diff", "miles-9.9"], "plan.diff"
    )
    assert all(t in err for t in TARGETS), err


COMMANDS_WITH_THEIR_NEEDS = [
    ["cases"],
    ["plan", CASE, "--platform", "cpu"],
    ["prepare", CASE],
    ["verify", "DIR"],
    ["run", CASE],
    ["report", "--history", "DB"],
    ["calibrate", "RUN"],
]


@pytest.mark.parametrize("argv", COMMANDS_WITH_THEIR_NEEDS, ids=lambda argv: argv[0])
def test_an_unknown_option_points_at_the_command_s_own_help(capsys, argv):
    """Its --help lists what the command takes; the top level's lists only the commands."""
    err = refused(capsys, [*argv, "--no-such-option"], "usage")
    assert f"unrecognized arguments: --no-such-option. Fix: see `rlsmoke {argv[0]} --help`." in err, err


@pytest.mark.parametrize("size", ["0", "0.5"])
def test_a_max_shard_size_under_a_byte_is_refused_not_the_default(tmp_path, capsys, size):
    refused(capsys, ["prepare", CASE, "--tiny", "--max-shard-size", size, "--out", tmp_path / "x"], "usage")
    assert not (tmp_path / "x").exists()


# --- report --history (H1-H4, H8) --------------------------------------------------------------


def _history(path: Path, metrics: str = "{}") -> Path:
    from rlsmoke.history import connect

    with connect(path) as conn:
        conn.execute("INSERT INTO runs (created, \"commit\", \"case\", platform, device, launcher, trusted, verdict, "
                     "metrics, gates, artifacts) VALUES (0, 'c', ?, 'cpu', 'CPU', 'builtin', 1, 'PASS', ?, '[]', 'a')",
                     (CASE, metrics))  # fmt: skip
    return path


def test_report_on_a_file_that_is_not_sqlite(tmp_path, capsys):
    (tmp_path / "notdb.txt").write_text("text\n")
    refused(
        capsys, ["report", "--history", tmp_path / "notdb.txt", "--out", tmp_path / "rep"], "history.format"
    )


def test_report_on_an_empty_file_leaves_it_empty(tmp_path, capsys):
    (tmp_path / "empty.db").write_text("")
    refused(
        capsys, ["report", "--history", tmp_path / "empty.db", "--out", tmp_path / "rep"], "history.schema"
    )
    assert (tmp_path / "empty.db").read_bytes() == b""


def test_report_on_another_schema(tmp_path, capsys):
    with sqlite3.connect(tmp_path / "future.db") as conn:
        conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, series TEXT, values_json TEXT)")
    err = refused(
        capsys, ["report", "--history", tmp_path / "future.db", "--out", tmp_path / "rep"], "history.schema"
    )
    assert "platform" in err


def test_report_on_a_row_whose_metrics_are_not_json(tmp_path, capsys):
    db = _history(tmp_path / "h.db", metrics="{not json")
    refused(capsys, ["report", "--history", db, "--out", tmp_path / "rep"], "history.row")


def test_report_out_naming_a_file(tmp_path, capsys):
    db = _history(tmp_path / "h.db", metrics='{"train/train_rollout_kl": 0.1}')
    (tmp_path / "afile").write_text("mine\n")
    refused(capsys, ["report", "--history", db, "--out", tmp_path / "afile"], "path.kind")
    assert (tmp_path / "afile").read_text() == "mine\n"


# --- an unexpected exception: exit 3, the traceback in a log the line names -----------------------


def test_a_crash_in_any_command_is_exit_3_with_its_traceback_in_a_log(tmp_path, capsys, monkeypatch):
    import rlsmoke.calibration

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(rlsmoke.calibration, "run", broken)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "r").mkdir()
    assert main(["calibrate", str(tmp_path / "r")]) == ExitCode.RUN_FAILED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        "error: [calibrate.crashed] ZeroDivisionError: planted"
    ), err
    log = Path(re.search(r"Traceback in (\S+)$", err).group(1))
    assert log.parent == tmp_path and "Traceback" in log.read_text() and "planted" in log.read_text()


def test_an_os_error_on_a_users_path_deep_in_a_command_is_exit_2(tmp_path, capsys, monkeypatch):
    import rlsmoke.calibration

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "theirs"))

    monkeypatch.setattr(rlsmoke.calibration, "run", denied)
    (tmp_path / "r").mkdir()
    err = refused(capsys, ["calibrate", tmp_path / "r"], "path.denied")
    assert str(tmp_path / "theirs") in err


# --- thresholds: a key twice in any object (T1) ---------------------------------------------------


def test_a_key_twice_inside_a_gate_is_refused(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "thresholds"
    folder.mkdir()
    gate = '{"name": "kl", "metric": "train/train_rollout_kl", "op": "<=", "bound": 1e9, "bound": 5.3e-06}'
    (folder / "cluster.json").write_text(f'{{"schema_version": 1, "entries": [{{"key": {{"case": "{CASE}"}}, '
                                         f'"gates": [{gate}]}}]}}')  # fmt: skip
    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(folder))
    err = refused(
        capsys, ["run", CASE, "--platform", "cpu", "--out", tmp_path / "o"], "thresholds.duplicate_key"
    )
    assert "'bound' twice" in err and "cluster.json" in err


def test_a_deleted_working_folder_with_an_absolute_out_in_a_fresh_process(tmp_path):
    """As a shell runs it: without the check, torch's libraries fail to load (MKL's fatal line, exit 2 with
    no rule) and the --out keeps a stale lock."""
    import subprocess
    import sys

    gone, out = tmp_path / "gone", tmp_path / "b"
    gone.mkdir()
    script = f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); from rlsmoke.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", script, "run", CASE, "--platform", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: [path.cwd_gone] ") and len(proc.stderr.splitlines()) == 1, (
        proc.stderr
    )
    assert not out.exists()
