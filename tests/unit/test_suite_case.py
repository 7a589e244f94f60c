"""Which case a GPU pair runs: the session's NUM_GPUS, and the one-GPU variant where full width won't fit."""

import pytest

from rlsmoke.cases import Case
from rlsmoke.platforms import Host
from rlsmoke.selection import effective_case, memory_shortfall

GLM5 = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=8)


def test_num_gpus_replaces_the_module_constant():
    assert effective_case(GLM5, 2).num_gpus == 2
    assert effective_case(GLM5, None).num_gpus == 8


def test_one_gpu_runs_the_64_expert_variant():
    one = effective_case(GLM5, 1)
    assert (one.name, one.num_gpus) == ("glm5-744b-a40b-4layer-1gpu", 1)
    assert one.spec().num_experts == 64


def test_cpu_and_models_without_a_variant_are_untouched():
    cpu = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
    assert effective_case(cpu, 1) == cpu
    glm45 = Case("glm4.5-355b-a32b-4layer", platform="nvidia", num_gpus=8)
    assert effective_case(glm45, 1).name == "glm4.5-355b-a32b-4layer"


def test_one_gpu_runs_flash_s_112_expert_variant():
    flash = effective_case(Case("glm5.3-flash-4layer", platform="nvidia", num_gpus=8), 1)
    assert (flash.name, flash.num_gpus, flash.spec().num_experts) == ("glm5.3-flash-4layer-1gpu", 1, 112)
    assert memory_shortfall(flash, Host("nvidia", "H200", 1)) == ""


def test_a_case_too_big_for_the_gpus_says_so():
    h200 = Host("nvidia", "H200", 1)
    flash = Case("glm5.3-flash-4layer", platform="nvidia", num_gpus=1)
    reason = memory_shortfall(flash, h200)
    assert "GiB per GPU" in reason and "141 GiB" in reason and "--num-gpus" in reason
    assert memory_shortfall(Case("glm5.3-flash-4layer", platform="nvidia", num_gpus=2), h200) == ""
    one = effective_case(GLM5, 1)
    assert memory_shortfall(one, h200) == ""  # the 64-expert variant fits one H200
    assert memory_shortfall(Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=1), h200) != ""


def test_the_decision_carries_the_shortfall_so_the_plugin_skips_at_collection():
    from rlsmoke.selection import Decision, Requirement, decide

    h200 = Host("nvidia", "H200", 1)
    whole = Case("glm5-744b-a40b", platform="nvidia", num_gpus=8)  # 78 layers, no one-GPU variant
    d = decide(Requirement("nvidia", 1), h200, case=whole, num_gpus=1)
    assert not d.run and d.reason == memory_shortfall(effective_case(whole, 1), h200)
    assert decide(Requirement("nvidia", 1), h200, case=GLM5, num_gpus=1) == Decision(
        True
    )  # the 1-GPU variant
    flash = Case("glm5.3-flash-4layer", platform="nvidia", num_gpus=8)
    assert decide(Requirement("nvidia", 1), h200, case=flash, num_gpus=1) == Decision(True)


def test_two_gpus_run_all_256_experts():
    two = effective_case(GLM5, 2)
    assert (two.name, two.num_gpus, two.spec().num_experts) == ("glm5-744b-a40b-4layer", 2, 256)


def test_a_declared_run_s_flags_go_to_rlsmoke_run_and_a_miles_launch_refuses_them(tmp_path):
    from rlsmoke.errors import RlsmokeError
    from rlsmoke.processes.lease import GpuLease
    from rlsmoke.suite import Artifacts, plan_launch

    flags = ("--offload", "--num-rollout", "3")
    cpu = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
    launch = plan_launch(cpu, Artifacts(tmp_path / "cpu"), flags=flags)
    assert launch.argv[-3:] == flags and launch.argv[3] == "run"
    miles = Artifacts(tmp_path / "miles", launcher="miles", host=Host("nvidia", "H200", 8), miles_root=tmp_path,
                      lease=GpuLease("nvidia", tuple("01234567")))  # fmt: skip
    eight = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=8)
    with pytest.raises(RlsmokeError) as refused:
        plan_launch(eight, miles, flags=flags)
    assert refused.value.rule == "launcher.flags"
    assert plan_launch(eight, miles).launcher == "miles"


HOW_RUNS_START = [
    ("cpu", "fsdp", "here"),
    ("cpu", "megatron", "forked"),
    ("nvidia", "fsdp", "forked"),
    ("nvidia", "megatron", "forked"),
    ("rocm", "fsdp", "spawned"),
]


@pytest.mark.parametrize(("platform", "trainer", "how"), HOW_RUNS_START)
def test_how_each_run_starts(tmp_path, monkeypatch, platform, trainer, how):
    """CPU runs in the pytest process; megatron's and NVIDIA's forked from the fork server (no interpreter
    start-up, a process of their own to kill); ROCm's spawned, since HIP cannot be asked whether a fork
    is safe."""
    import sys

    from rlsmoke import suite
    from rlsmoke.artifacts import Artifacts
    from rlsmoke.processes import here, runner

    def started(*args, start=None, **kwargs):
        return {None: "spawned", here.start_forked: "forked"}[start]

    monkeypatch.setattr(here, "run_here", lambda *args, **kwargs: "here")
    monkeypatch.setattr(runner, "run", started)
    argv = (sys.executable, "-m", "rlsmoke.cli", "run", "glm5-744b-a40b-4layer", "--platform", platform)
    case = Case("glm5-744b-a40b-4layer", platform=platform)
    launch = suite.CaseLaunch(case, Artifacts(tmp_path, trainer=trainer), "builtin", 60, {}, argv)
    assert suite._run_builtin(launch) == how
