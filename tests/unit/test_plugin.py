"""The pytest plugin through pytester: markers, skip reasons, options, the artifacts fixture.

GPU hosts are stood in for by an `nvidia-smi` / `rocm-smi` script on PATH that prints what the real
tool prints; those runs use `runpytest_subprocess` because detection is cached per process.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from procs import alive

from rlsmoke.engine import megatron
from rlsmoke.platforms import Host
from rlsmoke.selection import Decision, Requirement, decide, requirement

pytest_plugins = ["pytester"]

H200x1 = Host("nvidia", "H200", 1)
H200x8 = Host("nvidia", "H200", 8)
MI355x8 = Host("rocm", "MI355X", 8)
CPU = Host("cpu", "CPU", 0)

# (requirement, host, launcher, miles_root, expected reason; "" = runs)
DECISIONS = [
    (Requirement("rocm", 8), H200x1, "miles", "/m", "needs 8 ROCm GPUs; found 1 NVIDIA H200"),
    (Requirement("nvidia", 8), H200x1, "miles", "/m", "needs 8 NVIDIA GPUs; found 1 NVIDIA H200"),
    (Requirement("nvidia", 8), CPU, "miles", "/m", "needs 8 NVIDIA GPUs; found no GPU (CPU only)"),
    (Requirement("rocm", 16), MI355x8, "miles", "/m", "needs 16 ROCm GPUs; found 8 ROCm MI355X"),
    (Requirement("nvidia", 1), H200x8, "builtin", None, ""),
    (Requirement("nvidia", 8), H200x8, "builtin", None, ""),  # FSDP2 over the 8 GPUs
    (Requirement("rocm", 2), MI355x8, "builtin", None, ""),
    (Requirement("nvidia", 8), H200x8, "miles", "/m", ""),
    (Requirement("rocm", 8), MI355x8, "miles", "/m", ""),
    (Requirement("cpu", 0), CPU, "miles", None, ""),
]


@pytest.mark.parametrize(("req", "host", "launcher", "root", "reason"), DECISIONS)
def test_decide(req, host, launcher, root, reason):
    assert decide(req, host, launcher=launcher, miles_root=root) == Decision(not reason, reason)


def test_decide_miles_without_root_names_the_option():
    d = decide(Requirement("nvidia", 8), H200x8, launcher="miles", miles_root=None)
    assert not d.run and "--miles-root" in d.reason and "needs 8 NVIDIA GPUs" in d.reason


def test_decide_builtin_async_beyond_two_gpus_names_the_fix():
    d = decide(Requirement("rocm", 8), MI355x8, launcher="builtin")
    assert not d.run and "--launcher miles" in d.reason and "async" in d.reason


@pytest.mark.parametrize(
    ("markers", "gpus", "override", "expected"),
    [
        (["rocm", "gpus"], 8, None, Requirement("rocm", 8)),
        (["rocm", "gpus"], 8, 4, Requirement("rocm", 4)),  # --num-gpus / NUM_GPUS replaces the module's
        (["nvidia"], None, None, Requirement("nvidia", 1)),
        (["cpu", "slow"], None, 8, Requirement("cpu", 0)),
        (["slow"], None, None, None),
    ],
)
def test_requirement(markers, gpus, override, expected):
    assert requirement(markers, gpus, override) == expected


def test_requirement_rejects_two_vendors():
    with pytest.raises(ValueError, match="markers=.*nvidia.*rocm"):
        requirement(["nvidia", "rocm"], 8, None)


# --- through pytest --------------------------------------------------------------------------------

PAIR = """
import os
import pytest

NUM_GPUS = 8

@pytest.mark.{platform}
@pytest.mark.gpus(NUM_GPUS)
def test_pair(gpu_lease, rlsmoke_ports):
    print("LEASE", gpu_lease.env())
"""


def _fake_smi(pytester, tool: str, lines: list[str]) -> dict:
    """A `nvidia-smi` / `rocm-smi` on PATH that prints `lines`; returns the env for a subprocess run."""
    bindir = pytester.path / "fakebin"
    bindir.mkdir(exist_ok=True)
    script = bindir / tool
    script.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(lines) + "\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def isolated(pytester, monkeypatch, tmp_path):
    """Leases in a private folder; no NUM_GPUS from the caller's shell."""
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    monkeypatch.delenv("NUM_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("HIP_VISIBLE_DEVICES", raising=False)
    pytester.makeini("[pytest]\naddopts = --strict-markers -ra\n")
    return pytester


def test_markers_are_registered(isolated):
    result = isolated.runpytest("--markers")
    for name in ("@pytest.mark.nvidia", "@pytest.mark.rocm", "@pytest.mark.cpu", "@pytest.mark.gpus(n)",
                 "@pytest.mark.slow"):  # fmt: skip
        result.stdout.fnmatch_lines([f"{name}:*"])


def test_case_record_without_a_run_is_a_usage_error_naming_the_fix(isolated):
    isolated.makepyfile(test_nothing="def test_x(case_record):\n    pass\n")
    result = isolated.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*uses case_record without a run: parametrize it with rlsmoke.suite.CaseRun*"]
    )


def test_unknown_marker_is_an_error(isolated):
    isolated.makepyfile("import pytest\n@pytest.mark.nvdia\ndef test_x():\n    pass\n")
    result = isolated.runpytest()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*'nvdia' not found in `markers` configuration option*"])


def test_bad_gpus_marker_is_a_usage_error(isolated):
    isolated.makepyfile("import pytest\n@pytest.mark.rocm\n@pytest.mark.gpus('8')\ndef test_x():\n    pass\n")
    result = isolated.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpus('8',) is wrong. Write @pytest.mark.gpus(N) with N >= 1*"])


def test_pairs_skip_on_cpu_host_with_reasons(isolated):
    isolated.makepyfile(test_n=PAIR.format(platform="nvidia"), test_r=PAIR.format(platform="rocm"),
                        test_c="import pytest\n@pytest.mark.cpu\ndef test_c():\n    pass\n")  # fmt: skip
    result = isolated.runpytest("--platform", "cpu")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*needs 8 NVIDIA GPUs; found no GPU (CPU only)",
                                 "*SKIPPED*needs 8 ROCm GPUs; found no GPU (CPU only)"], consecutive=False)  # fmt: skip


def test_marker_selection_lists_the_pairs(isolated):
    isolated.makepyfile(test_n=PAIR.format(platform="nvidia"), test_r=PAIR.format(platform="rocm"))
    result = isolated.runpytest("-m", "rocm", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["test_r.py::test_pair", "*1/2 tests collected (1 deselected)*"])


def test_rocm_pair_on_one_h200_names_both(isolated):
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"])
    isolated.makepyfile(test_r=PAIR.format(platform="rocm"), test_n=PAIR.format(platform="nvidia"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        result = isolated.runpytest_subprocess("--launcher", "miles", "--miles-root", str(isolated.path))
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*needs 8 ROCm GPUs; found 1 NVIDIA H200*"], consecutive=False)
    result.stdout.fnmatch_lines(["*needs 8 NVIDIA GPUs; found 1 NVIDIA H200*"], consecutive=False)


def test_more_gpus_than_exist_is_a_skip(isolated):
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"] * 8)
    isolated.makepyfile(test_n=PAIR.format(platform="nvidia"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        mp.setenv("NUM_GPUS", "16")
        result = isolated.runpytest_subprocess("--launcher", "miles", "--miles-root", str(isolated.path))
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs 16 NVIDIA GPUs; found 8 NVIDIA H200*"])


def test_miles_without_root_is_a_skip_naming_the_option(isolated):
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"] * 8)
    isolated.makepyfile(test_n=PAIR.format(platform="nvidia"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        mp.delenv("MILES_ROOT", raising=False)
        result = isolated.runpytest_subprocess("--launcher", "miles")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--launcher miles without --miles-root*pass --miles-root DIR*"])


def test_pair_runs_with_visible_devices_when_gpus_exist(isolated):
    env = _fake_smi(
        isolated, "rocm-smi", [f"GPU[{i}]\t\t: Card series:\t\tAMD Instinct MI355X" for i in range(8)]
    )
    isolated.makepyfile(test_r=PAIR.format(platform="rocm"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        result = isolated.runpytest_subprocess(
            "-s", "--launcher", "miles", "--miles-root", str(isolated.path)
        )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*LEASE {'HIP_VISIBLE_DEVICES': '0,1,2,3,4,5,6,7'}*"])


def test_bad_num_gpus_env_is_a_usage_error(isolated):
    isolated.makepyfile("def test_x():\n    pass\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NUM_GPUS", "eight")
        result = isolated.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*NUM_GPUS='eight' is not an integer*"])


@pytest.mark.parametrize("how", ["env", "option"])
def test_zero_gpus_runs_the_cpu_cases_and_skips_the_gpu_ones(isolated, how):
    """NUM_GPUS=0 means "no GPUs", even on a GPU host: CPU cases run, GPU pairs skip and say why."""
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"] * 8)
    isolated.makepyfile(test_n=PAIR.format(platform="nvidia"),
                        test_c="import pytest\n@pytest.mark.cpu\ndef test_c():\n    pass\n")  # fmt: skip
    args = ["--num-gpus", "0"] if how == "option" else []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        if how == "env":
            mp.setenv("NUM_GPUS", "0")
        only_cpu = isolated.runpytest_subprocess("-m", "cpu", *args)
        both = isolated.runpytest_subprocess("-rs", *args)
    assert only_cpu.ret == pytest.ExitCode.OK
    only_cpu.assert_outcomes(passed=1, deselected=1)
    both.assert_outcomes(passed=1, skipped=1)
    both.stdout.fnmatch_lines(["*SKIPPED*needs NVIDIA GPUs*0 GPUs asked for*"])


def test_negative_num_gpus_is_a_usage_error(isolated):
    isolated.makepyfile("def test_x():\n    pass\n")
    result = isolated.runpytest("--num-gpus", "-1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--num-gpus=-1 must be >= 0*"])


def test_platform_contradicting_the_host_is_a_usage_error(isolated):
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"])
    isolated.makepyfile(test_r=PAIR.format(platform="rocm"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        result = isolated.runpytest_subprocess("--platform", "rocm")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--platform=rocm but this host has 1 NVIDIA H200. Drop --platform*"])


def test_xdist_workers_lease_disjoint_gpus_and_ports(isolated, tmp_path):
    """Six 2-GPU tests on four GPUs over three workers: leases that overlap in time share no GPU."""
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"] * 4)
    log = tmp_path / "leases.log"
    isolated.makepyfile(
        test_lease=textwrap.dedent(f"""
        import os, time
        import pytest

        @pytest.mark.nvidia
        @pytest.mark.gpus(2)
        @pytest.mark.parametrize("i", range(6))
        def test_hold(i, gpu_lease, rlsmoke_ports):
            start = time.time()
            time.sleep(0.4)
            with open({str(log)!r}, "a") as f:
                f.write(f"{{start}} {{time.time()}} {{gpu_lease.env()['CUDA_VISIBLE_DEVICES']}} "
                        f"{{os.environ.get('PYTEST_XDIST_WORKER')}} {{rlsmoke_ports.base}}\\n")
    """)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        result = isolated.runpytest_subprocess("-n", "3", "-p", "xdist")
    result.assert_outcomes(passed=6)
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len(rows) == 6
    for a in rows:
        for b in rows:
            if (
                a is not b and float(a[0]) < float(b[1]) and float(b[0]) < float(a[1])
            ):  # held at the same time
                assert not set(a[2].split(",")) & set(b[2].split(",")), f"shared GPUs: {a} {b}"
    ports = {w: p for *_, w, p in rows}
    assert len(set(ports.values())) == len(ports), f"workers share a port block: {ports}"


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


def test_plugin_import_is_light():
    """The plugin loads in every pytest session: it must not pull in torch, ray or matplotlib."""
    import subprocess

    code = ("import sys, rlsmoke.pytest_plugin, rlsmoke.suite, rlsmoke.processes.runner, rlsmoke.history; "
            "print(sorted(m for m in ('torch', 'ray', 'matplotlib', 'transformers') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


TOO_BIG = """
import pytest
from rlsmoke.cases import Case

NUM_GPUS = 1
CASE = Case("glm5-744b-a40b", platform="nvidia", num_gpus=NUM_GPUS)  # 78 layers, no one-GPU variant


@pytest.mark.nvidia
@pytest.mark.gpus(NUM_GPUS)
def test_one_step():
    raise AssertionError("a case that does not fit must be skipped before it runs")
"""
BUILT_IN_THE_TEST = """
import pytest
from rlsmoke.selection import DoesNotFit


@pytest.mark.nvidia
def test_case_built_in_the_test():
    raise DoesNotFit("needs about 999 GiB per GPU")
"""


def test_a_case_too_big_for_the_host_is_skipped(isolated):
    """A module's CASE is weighed at collection; a case a test builds itself is skipped when the runner says so."""
    env = _fake_smi(isolated, "nvidia-smi", ["NVIDIA H200"])
    isolated.makepyfile(test_big=TOO_BIG, test_built=BUILT_IN_THE_TEST)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", env["PATH"])
        result = isolated.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*needs * GiB per GPU*glm5-744b-a40b over 1 GPU*1 NVIDIA H200 has 141 GiB*",
                                 "*needs about 999 GiB per GPU*"], consecutive=False)  # fmt: skip


MEGATRON_PAIR = """
import pytest
from rlsmoke.cases import Case
from rlsmoke.suite import gates_for, run_case

CASE = Case("{name}", platform="cpu", tiny=True)


@pytest.mark.cpu
def test_one_step(artifacts):
    gates_for(CASE).check(run_case(CASE, artifacts))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not megatron.available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"
)
def test_trainer_megatron_runs_the_suite_through_megatron_core(isolated):
    """`--trainer megatron`: GLM-5 trains through megatron-core, gated by its own key; Flash skips, saying why."""
    isolated.makepyfile(test_glm5=MEGATRON_PAIR.format(name="glm5-744b-a40b-4layer"),
                        test_flash=MEGATRON_PAIR.format(name="glm5.3-flash-4layer"))  # fmt: skip
    result = isolated.runpytest_subprocess("-rs", "--trainer", "megatron")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*glm5.3-flash-4layer: megatron-core has no KDA linear attention*"])
    (summary,) = (isolated.path / "artifacts").glob("test_glm5.py_test_one_step/summary.json")
    assert json.loads(summary.read_text())["launcher"] == "builtin-megatron"


LONG_RUN = """
    import sys
    from pathlib import Path

    from rlsmoke.processes import runner

    def test_a_long_run(tmp_path):
        run = runner.Process([sys.executable, "-c", "import time; time.sleep(300)"], env=runner.clean_env(),
                             log=tmp_path / "run.log")
        Path("run.pid").write_text(str(run.proc.pid))
        run.wait(300)
"""


A_FORKED_CHILD = """
    import multiprocessing
    import os
    import signal
    import time

    def report_sigterm_handler(conn):
        conn.send(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)

    def test_a_forked_child_starts_with_sigterm_s_default():
        parent, child_end = multiprocessing.Pipe()
        child = multiprocessing.get_context("fork").Process(target=report_sigterm_handler, args=(child_end,))
        child.start()
        assert parent.recv() is True
        child.join(20)

    def test_a_forked_child_ends_on_sigterm():
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGTERM)
        child.join(20)
        assert child.exitcode == -signal.SIGTERM
"""


def test_a_process_forked_from_the_session_keeps_sigterm_s_default(isolated):
    """A multiprocessing pool's worker, forked from the session, inherits its SIGTERM handler. Raising
    there instead of ending left a pool's `terminate` waiting on a lock its dead sibling held; and a
    handler that ends the process is not enough, since a SIGTERM that lands just before the worker's
    blocking wait is never acted on (the suite hung in test_plugin_lease both ways). The fork starts
    with the default, so the kernel ends it whatever it is doing."""
    isolated.makepyfile(test_fork=A_FORKED_CHILD)
    result = isolated.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2)


A_HUNG_CHILD = """
    import multiprocessing
    import time
    from pathlib import Path

    def test_a_child_that_never_ends():
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,), daemon=True)
        child.start()
        Path("child.pid").write_text(str(child.pid))
        child.join()
"""


@pytest.mark.parametrize("limit, outcome", [("3", "failed"), ("0", None)], ids=["ci-limit", "no-limit"])
def test_ci_s_test_limit_turns_a_hang_into_a_failure_with_its_stack(isolated, monkeypatch, limit, outcome):
    """.ci/run sets PYTEST_TIMEOUT: a test that hangs joining a child (as test_plugin_lease once did) fails
    with where it waited, and the session goes on. Twin: without a limit the same test is still waiting."""
    pytest.importorskip("pytest_timeout")
    assert "\nexport PYTEST_TIMEOUT=" in (Path(__file__).parents[2] / ".ci/run").read_text()
    monkeypatch.setenv("PYTEST_TIMEOUT", limit)
    isolated.makepyfile(test_hang=A_HUNG_CHILD)
    try:
        if outcome:
            result = isolated.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
            result.assert_outcomes(failed=1)
            result.stdout.fnmatch_lines([">*child.join()", "*Timeout (>3.0s)*"])
        else:
            with pytest.raises(pytest.Pytester.TimeoutExpired):
                isolated.runpytest_subprocess("-p", "no:cacheprovider", timeout=6)
    finally:
        pid_file = isolated.path / "child.pid"
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the twin's child, which this test started


@pytest.mark.parametrize("plugin, sends, ended", [("rlsmoke", 1, True), ("rlsmoke", 2, True), ("no:rlsmoke", 1, False)],
                         ids=["plugin", "plugin-twice", "no-plugin"])  # fmt: skip
def test_sigterm_to_the_session_ends_the_runs_it_launched(isolated, plugin, sends, ended):
    """A CI job's timeout sends SIGTERM: the run (a session of its own) must not outlive pytest and keep
    its GPU for the next job. coreutils' `timeout` sends it twice (to pytest, then to its group): the
    second must not cut the teardown short. Twin: without the plugin the default SIGTERM kills pytest alone."""
    isolated.makepyfile(test_long=LONG_RUN)
    args = ["-p", plugin] if plugin.startswith("no:") else []
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "test_long.py"],
                               cwd=isolated.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    pid_file = isolated.path / "run.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists() and session.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), session.communicate(timeout=30)[0]
    run_pid = int(pid_file.read_text())
    time.sleep(1)  # into the wait
    for _ in range(sends):
        session.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the handler has run: a repeat sent at once would merge into the first
    output = session.communicate(timeout=60)[0]
    try:
        assert alive(run_pid) is not ended, output
        if ended:
            assert session.returncode == pytest.ExitCode.INTERRUPTED, output
    finally:
        if alive(run_pid):
            os.kill(run_pid, signal.SIGKILL)  # the twin's run, which this test started
