"""The pytest plugin through pytester: markers, skip reasons, GPU leases, the --trainer option.

GPU hosts are stood in for by an `nvidia-smi` / `rocm-smi` script on PATH that prints what the real
tool prints; those runs use `runpytest_subprocess` because detection is cached per process.
"""

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from rlsmoke.engine import megatron

pytest_plugins = ["pytester"]

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


def test_plugin_import_is_light():
    """The plugin loads in every pytest session: it must not pull in torch, ray or matplotlib."""

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
