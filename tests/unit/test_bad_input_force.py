"""`prepare --force` replaces only what rlsmoke built: an empty folder or one of its checkpoints. A folder
holding anything else (the current folder, a home) is refused untouched: `checkpoint.not_ours`, exit 2."""

import os
from pathlib import Path

import pytest

from rlsmoke.checkpoints.safety import OWNED_NAME
from rlsmoke.cli import main
from rlsmoke.errors import ExitCode

CASE = "glm5-744b-a40b-4layer"


def prepare(capsys, out, *extra) -> tuple[int, str]:
    code = main(["prepare", CASE, "--tiny", "--force", "--no-progress", "--out", str(out), *extra])
    return code, capsys.readouterr().err.strip()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused_untouched(capsys, out, *, named: str) -> None:
    before = snapshot(Path(out))
    code, err = prepare(capsys, out)
    assert code == ExitCode.USAGE, err
    assert err.startswith("error: [checkpoint.not_ours]") and "Fix: " in err and len(err.splitlines()) == 1, (
        err
    )
    assert named in err, err
    assert snapshot(Path(out)) == before


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSMOKE_CACHE", str(tmp_path / "cache"))


def test_a_plain_folder_with_a_users_file_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "p"
    out.mkdir()
    (out / "mine").write_text("x\n")
    refused_untouched(capsys, out, named="mine")


def test_the_current_folder_is_not_replaced(tmp_path, capsys, monkeypatch):
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "code.py").write_text("print(1)\n")
    (project / "README.txt").write_text("mine\n")
    monkeypatch.chdir(project)
    refused_untouched(capsys, ".", named="README.txt")
    assert (project / "src" / "code.py").is_file()


def test_the_home_folder_is_not_replaced(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id").write_text("secret\n")
    (home / "thesis.tex").write_text("\\begin{document}\n")
    monkeypatch.setenv("HOME", str(home))
    refused_untouched(capsys, os.path.expanduser("~"), named=".ssh/")


def test_a_checkpoint_with_a_users_file_added_is_not_replaced(tmp_path, capsys):
    out = tmp_path / "ck"
    assert prepare(capsys, out)[0] == ExitCode.OK
    (out / "notes.txt").write_text("what I found\n")
    refused_untouched(capsys, out, named="notes.txt")


def test_an_empty_folder_and_rlsmokes_own_checkpoint_are_replaced(tmp_path, capsys):
    out = tmp_path / "ck"
    out.mkdir()
    assert prepare(capsys, out)[0] == ExitCode.OK and (out / OWNED_NAME).is_file()
    first = (out / "model-00001-of-00001.safetensors").read_bytes()
    (out / OWNED_NAME).unlink()  # an older build, told by its sha256 manifest
    code, err = prepare(capsys, out, "--seed", "1")
    assert code == ExitCode.OK, err
    assert (out / "model-00001-of-00001.safetensors").read_bytes() != first
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".ck.")]  # no stage or trash left


def test_a_users_folder_named_like_a_builds_leftover_is_kept(tmp_path, capsys):
    out, look_alike = tmp_path / "new", tmp_path / ".new.tmp-backup"
    look_alike.mkdir()
    (look_alike / "mine").write_text("x\n")
    assert prepare(capsys, out)[0] == ExitCode.OK
    assert (look_alike / "mine").is_file()


def test_a_cache_folder_holding_a_users_file_is_not_rebuilt_over(tmp_path):
    from rlsmoke.checkpoints.cache import cached_folder
    from rlsmoke.checkpoints.cache import prepare as cached
    from rlsmoke.errors import CheckpointError

    folder = cached_folder(CASE, tiny=True)
    folder.mkdir(parents=True)
    (folder / "mine").write_text("x\n")
    with pytest.raises(CheckpointError, match="not_ours|did not write") as caught:
        cached(CASE, tiny=True)
    assert caught.value.rule == "checkpoint.not_ours" and (folder / "mine").read_text() == "x\n"


def test_sigterm_to_prepare_leaves_no_temporary_folder(tmp_path):
    """A CI job's timeout (SIGTERM) mid-write cleans up as Ctrl-C does: exit 143, no `.OUT.tmp-*` left."""
    import signal
    import sys
    import time

    from procs import ForkedCli

    out = tmp_path / "ck"
    env = {**os.environ, "RLSMOKE_CACHE": str(tmp_path / "cache")}
    # the CLI from its first line in a process of its own, forked with torch imported: no interpreter's imports
    proc = ForkedCli([sys.executable, "-m", "rlsmoke.cli", "prepare", "glm5-744b-a40b-4layer", "--tiny",
                      "--out", str(out)], tmp_path / "io", env=env)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".ck.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "prepare finished before its temporary folder was seen"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted by SIGTERM" in err, err
    assert list(tmp_path.glob(".ck.tmp-*")) == [] and not out.exists()
