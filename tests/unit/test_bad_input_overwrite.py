"""`run --overwrite` stages its records inside --out, so the rename that commits them reaches them even when
--out is a link to (or a mount of) another file system; it removes only what a run writes; and it prints
the folder the records end up in."""

import json
import os
import tempfile
from pathlib import Path

import pytest

from rlsmoke.artifacts import RECORDS, STAGING_NAME, RunFolder
from rlsmoke.errors import ExitCode, RlsmokeError

CASE = "glm5-744b-a40b-4layer"
SHM = Path("/dev/shm")


def text(name: str, which: str) -> str:
    return json.dumps({"which": which}) + "\n" if name.endswith(".json") else f"{which} {name}\n"


def earlier(folder: Path) -> None:
    for name in RECORDS:
        (folder / name).write_text(text(name, "earlier"))
    (folder / "notes.txt").write_text("mine\n")


def write_new_records(folder: RunFolder) -> None:
    for name in RECORDS:
        (folder.records / name).write_text(text(name, "new"))


@pytest.fixture
def elsewhere(tmp_path):
    """A folder on another file system than tmp_path when the host has one (a tmpfs), else a sibling."""
    other = (
        SHM
        if SHM.is_dir() and os.stat(SHM).st_dev != os.stat(tmp_path).st_dev and os.access(SHM, os.W_OK)
        else None
    )
    with tempfile.TemporaryDirectory(dir=other) as folder:
        yield Path(folder)


def test_an_overwrite_through_a_link_to_another_file_system_commits(tmp_path, elsewhere):
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    earlier(elsewhere)
    with RunFolder(link, overwrite=True) as folder:
        assert folder.records == link / STAGING_NAME
        write_new_records(folder)
        folder.commit()
    assert {n: (elsewhere / n).read_text() for n in RECORDS} == {n: text(n, "new") for n in RECORDS}
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted([*RECORDS, "notes.txt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link"]  # nothing staged beside the link


def test_a_staging_folder_holding_a_users_file_is_refused_not_removed(tmp_path):
    out = tmp_path / "D"
    out.mkdir()
    earlier(out)
    (out / STAGING_NAME).mkdir()
    (out / STAGING_NAME / "keep.txt").write_text("mine\n")
    with pytest.raises(RlsmokeError) as caught, RunFolder(out, overwrite=True):
        pass
    assert caught.value.rule == "run.not_ours" and (out / STAGING_NAME / "keep.txt").read_text() == "mine\n"
    assert not (out / ".rlsmoke.lock").exists()
    (out / STAGING_NAME / "keep.txt").unlink()
    (out / STAGING_NAME / "run.log").write_text("an interrupted --overwrite run\n")  # the tool's own: cleared
    with RunFolder(out, overwrite=True) as folder:
        assert folder.records.is_dir() and not list(folder.records.iterdir())


def test_an_overwrite_run_prints_the_folder_its_records_end_up_in(tmp_path, capsys):
    from rlsmoke.cli import main

    out = tmp_path / "D"
    out.mkdir()
    (out / "summary.json").write_text('{"earlier": true}\n')
    (out / "notes.txt").write_text("mine\n")
    code = main(["run", CASE, "--platform", "cpu", "--out", str(out), "--overwrite"])
    printed = capsys.readouterr().out
    assert code == ExitCode.OK, printed
    assert f"artifacts: {out}\n" in printed and STAGING_NAME not in printed, printed
    assert json.loads((out / "summary.json").read_text())["artifacts"] == str(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([*RECORDS, "notes.txt"])
