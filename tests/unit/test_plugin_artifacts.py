"""The plugin's `artifacts` fixture and its session options, through pytester: a fresh folder per test,
one session per artifacts folder, nothing a live run or the user wrote removed."""

import subprocess
import sys
import time

import pytest

pytest_plugins = ["pytester"]


def test_artifacts_fixture_gives_a_fresh_folder(isolated, tmp_path):
    isolated.makepyfile(
        test_a="""
        import os
        def test_a(artifacts):
            assert os.listdir(artifacts.path) == []
            (artifacts / "x.txt").write_text("x")
            assert artifacts.launcher == "builtin" and artifacts.ports.master > 0
            print("PATH", os.fspath(artifacts))
    """
    )
    out = tmp_path / "art"
    for _ in range(2):  # the second run must not see the first run's file
        result = isolated.runpytest("-s", "--artifacts-dir", str(out))
        result.assert_outcomes(passed=1)
    assert (out / "test_a.py_test_a" / "x.txt").is_file()


@pytest.mark.parametrize("args", [("--run-timeout", "-5"), ("--run-timeout", "nan"), ("--run-timeout", "0"),
                                  ("--run-timeout", "inf"), ("--history", "notdb.db"), ("--history", ".")],
                         ids=["negative", "nan", "zero", "inf", "not-sqlite", "a-folder"])  # fmt: skip
def test_a_bad_option_value_is_a_usage_error_before_any_test_runs(isolated, args):
    (isolated.path / "notdb.db").write_text("garbage\n")
    isolated.makepyfile(test_a="def test_a():\n    open('ran', 'w').close()\n")
    result = isolated.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert args[0] in result.stderr.str() and not (isolated.path / "ran").exists()
    assert "Traceback" not in result.stderr.str()


def test_a_second_session_on_the_same_artifacts_is_refused_at_once(isolated, tmp_path):
    """Its `artifacts` fixture would empty folders the first one's runs write (they share the default
    <rootdir>/artifacts). Twin: with its own --artifacts-dir the second session runs."""
    isolated.makepyfile(
        test_wait="""
        import time
        from pathlib import Path

        def test_wait(artifacts):
            Path("started").touch()
            while not Path("go").exists():
                time.sleep(0.05)
    """
    )
    first = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_wait.py"],
                             cwd=isolated.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (isolated.path / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.05)
        started = time.monotonic()
        second = isolated.runpytest_subprocess("-p", "no:cacheprovider", "test_wait.py", timeout=60)
        assert (
            second.ret == pytest.ExitCode.USAGE_ERROR
            and "in use by another pytest session" in second.stderr.str()
        )
        assert time.monotonic() - started < 30
        (isolated.path / "go").touch()
        own = isolated.runpytest_subprocess("-p", "no:cacheprovider", "test_wait.py", "--artifacts-dir",
                                            str(tmp_path / "own"), timeout=60)  # fmt: skip
        own.assert_outcomes(passed=1)
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_the_artifacts_fixture_leaves_a_folder_a_live_run_holds(isolated):
    """A run that holds its folder's lock (`RunFolder`) keeps its records: the test fails, nothing removed."""
    from rlsmoke.artifacts import RunFolder

    root = isolated.path / "art"  # inside the rootdir: the test's folder is named alike in each session
    isolated.makepyfile(test_a="def test_a(artifacts):\n    pass\n")
    isolated.runpytest("--artifacts-dir", str(root)).assert_outcomes(passed=1)
    folder = root / "test_a.py_test_a"
    (folder / "mine").write_text("x")
    with RunFolder(folder / "out", overwrite=False):
        held = isolated.runpytest("--artifacts-dir", str(root))
    held.assert_outcomes(errors=1)
    held.stdout.fnmatch_lines(["*held by a live run*"])
    assert (folder / "mine").exists()
    isolated.runpytest("--artifacts-dir", str(root)).assert_outcomes(passed=1)  # released: emptied as usual
    assert not (folder / "mine").exists()


def test_a_summary_md_the_session_did_not_write_is_left_as_it_is(isolated, tmp_path):
    root = tmp_path / "art"
    root.mkdir()
    (root / "summary.md").write_text("my notes\n")
    isolated.makepyfile(
        test_a="""
        import json

        def test_a(artifacts):
            (artifacts.path / "summary.json").write_text(json.dumps({"case": "own"}))
    """
    )
    result = isolated.runpytest("--artifacts-dir", str(root))
    result.assert_outcomes(passed=1)
    assert (root / "summary.md").read_text() == "my notes\n"
    result.stdout.fnmatch_lines(["*summary.md was not written by rlsmoke*"])
    (root / "summary.md").unlink()  # twin: the session writes its own, and replaces it the next time
    for _ in range(2):
        isolated.runpytest("--artifacts-dir", str(root)).assert_outcomes(passed=1)
        assert "| own |" in (root / "summary.md").read_text()
