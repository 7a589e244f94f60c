"""The checkpoint cache: a read-only one that holds the checkpoint is read (its lock is never opened for
writing), an unwritable one that does not is one `error:` line; a --checkpoint whose config.json is no
object is refused as a corrupt checkpoint, exit 2."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from procs import run_cli

from rlsmoke.cli import main
from rlsmoke.errors import ExitCode

CASE = "glm5-744b-a40b-4layer"


def read_only(folder, *argv: str) -> subprocess.CompletedProcess:
    """`rlsmoke ARGV` with RLSMOKE_CACHE=folder bound read-only in a private mount namespace."""
    mount = f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder}"
    script = f"{mount} && exec {sys.executable} -m rlsmoke.cli " + " ".join(argv)
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RLSMOKE_CACHE": str(folder)})  # fmt: skip


@pytest.fixture(scope="module")
def can_mount(tmp_path_factory):
    probe = tmp_path_factory.mktemp("ro")
    if shutil.which("unshare") is None or read_only(probe, "cases").returncode != 0:
        pytest.skip("needs unshare -m and a bind mount (root, or a user namespace)")


def test_a_read_only_cache_that_holds_the_checkpoint_is_read(tmp_path, can_mount):
    cache = tmp_path / "cache"
    env = {**os.environ, "RLSMOKE_CACHE": str(cache)}
    built = run_cli([sys.executable, "-m", "rlsmoke.cli", "prepare", CASE, "--tiny", "--no-progress"], env=env,
                    timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    for lock in cache.rglob("*.lock"):
        lock.unlink()  # a cache copied read-only onto a machine may hold no lock file at all
    proc = read_only(cache, "prepare", CASE, "--tiny", "--no-progress")
    assert proc.returncode == ExitCode.OK, proc.stderr[-2000:]
    assert proc.stdout.strip() == built.stdout.strip()


def test_a_read_only_cache_without_the_checkpoint_is_one_line(tmp_path, can_mount):
    cache = tmp_path / "cache"
    cache.mkdir()
    proc = read_only(cache, "prepare", CASE, "--tiny", "--no-progress")
    err = proc.stderr.strip()
    assert proc.returncode == ExitCode.USAGE, err[-2000:]
    assert err.startswith("error: [path.read_only] RLSMOKE_CACHE=") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "Fix: " in err


def test_a_checkpoint_whose_config_is_not_an_object_is_exit_2(tmp_path, capsys, monkeypatch):
    from rlsmoke.checkpoints import prepare

    monkeypatch.setenv("RLSMOKE_CACHE", str(tmp_path / "cache"))
    ck = tmp_path / "ck1"
    shutil.copytree(prepare(CASE, tiny=True), ck)
    (ck / "config.json").write_text(json.dumps([1, 2]))
    code = main(["run", CASE, "--platform", "cpu", "--checkpoint", str(ck), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE, err
    assert (
        err.startswith("error: [checkpoint.verify] ") and "config.json" in err and "Traceback" not in err
    ), err
