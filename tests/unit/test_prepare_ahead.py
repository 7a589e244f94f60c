"""A GPU session's checkpoints are prepared side by side as it starts (`rlsmoke.checkpoints.ahead`): real
`rlsmoke prepare` processes into a private cache; a test reading one waits on the cache's lock."""

import os
import shutil
import time

import pytest

from rlsmoke.checkpoints.ahead import PreparedAhead, missing
from rlsmoke.checkpoints.cache import cached_folder, prepare

pytest_plugins = ["pytester"]

TINY = [("glm5-744b-a40b-4layer", True), ("glm4.5-355b-a32b-4layer", True)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSMOKE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_each_missing_checkpoint_is_prepared_once_side_by_side(cache, tmp_path):
    assert missing([*TINY, TINY[0]]) == TINY  # each once, in order
    ahead = PreparedAhead(TINY, tmp_path / "logs", jobs=2)
    try:
        assert ahead.wait() == {f"{name}-tiny": 0 for name, _ in TINY}
    finally:
        ahead.close()
    assert missing(TINY) == []
    for name, tiny in TINY:
        assert prepare(name, tiny=tiny) == cached_folder(name, tiny=tiny)
        assert str(cache) in (tmp_path / "logs" / f"{name}-tiny.log").read_text()  # its stdout: the folder


def test_close_ends_a_preparation_and_leaves_no_checkpoint_behind(cache, tmp_path):
    """A full-width checkpoint takes a while: the session that ends first ends it, its group and all."""
    name = "glm5-744b-a40b-4layer-1gpu"
    if shutil.disk_usage(tmp_path).free < 13e9:  # its preflight asks for room for the whole 11.5 GB first
        pytest.skip(f"{tmp_path} has under 13 GB free: a full-width build would be refused before it writes")
    ahead = PreparedAhead([(name, False)], tmp_path / "logs", jobs=1)
    try:
        deadline = time.monotonic() + 60
        while not list(cache.glob("checkpoints/.*tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.2)  # until it is writing
        (launched,) = ahead._live.values()
        proc = launched.proc
    finally:
        ahead.close(grace_s=20)
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing of its group is left
    assert missing([(name, False)]) == [(name, False)]  # no folder under the checkpoint's key
    assert not list(cache.glob("checkpoints/.*tmp-*")), "the interrupted build left its temporary folder"


GPU_MODULE = """
import pytest
from pathlib import Path
from rlsmoke.cases import Case
from rlsmoke.checkpoints.cache import prepare

NUM_GPUS = 8
CASE = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=NUM_GPUS, tiny=True)

@pytest.mark.nvidia
@pytest.mark.gpus(NUM_GPUS)
def test_reads_its_checkpoint(pytestconfig):
    prepare(CASE.name, tiny=True)  # waits on the lock while the session's own build runs
    logs = Path(pytestconfig.getoption("artifacts_dir")) / "prepare-ahead"
    assert (logs / "glm5-744b-a40b-4layer-tiny.log").is_file()
"""


@pytest.mark.parametrize("jobs", [None, "0"], ids=["ahead", "off"])
def test_a_gpu_session_starts_its_checkpoints_before_its_first_test(isolated, cache, jobs):
    # a unit module names its case by a string: no checkpoint of its own to prepare
    isolated.makepyfile(
        test_gpu=GPU_MODULE, test_named='CASE = "glm4.5-355b-a32b-4layer"\ndef test_y():\n    pass\n'
    )
    art = isolated.path / "art"
    flags = ["--platform", "nvidia", "--num-gpus", "1", f"--artifacts-dir={art}"]
    result = isolated.runpytest_subprocess(*flags, *(["--prepare-ahead", jobs] if jobs else []))
    if jobs == "0":  # each test prepares its own: no log, and the test's check fails
        result.assert_outcomes(failed=1, passed=1)
        assert (
            "preparing" not in result.stdout.str() and "glm5-744b-a40b-4layer-tiny.log" in result.stdout.str()
        )
    else:
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["rlsmoke: preparing glm5-744b-a40b-4layer ahead, 1 at a time*"])


@pytest.mark.parametrize("value", ["two", "-1"])
def test_the_option_is_a_count(isolated, value):
    isolated.makepyfile("def test_x():\n    pass\n")
    result = isolated.runpytest("--prepare-ahead", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--prepare-ahead" in result.stderr.str()
