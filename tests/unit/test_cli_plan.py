"""`rlsmoke cases` and `rlsmoke plan`, through the installed console script."""

import json
import subprocess
import sys

import pytest

GLM5 = "glm5-744b-a40b-4layer"


def rlsmoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlsmoke.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_cases_lists_the_required_names():
    out = rlsmoke("cases")
    assert out.returncode == 0
    assert {GLM5, "glm5-744b-a40b", "glm5.3-flash", "glm5.3-flash-4layer", "glm4.5-355b-a32b",
            "glm4.5-355b-a32b-4layer", "glm4.5-air"} <= set(out.stdout.split())  # fmt: skip


def test_plan_json_shape():
    out = rlsmoke(
        "plan", GLM5, "--platform", "rocm", "--num-gpus", "8", "--mode", "async", "--format", "json"
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["argv"][:2] == ["python3", "train_async.py"] and isinstance(plan["env"], dict)
    topo = plan["topology"]
    assert {"tp", "sp", "pp", "pp_layers", "cp", "ep", "etp", "dp"} <= set(topo["train"])
    assert {"engines", "gpus_per_engine", "tp", "dp", "ep", "dp_attention"} <= set(topo["rollout"])
    assert (topo["actor_gpus"], topo["rollout_gpus"], topo["ray_num_gpus"]) == (4, 4, 8)


def test_review_case_is_accepted_and_its_dp4_mirror_refused():
    ok = rlsmoke("plan", GLM5, "--platform", "rocm", "--num-gpus", "8", "--set", "rollout.gpus_per_engine=2",
                 "--set", "rollout.dp=2", "--set", "rollout.ep=2", "--set", "rollout.dp_attention=true")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    bad = rlsmoke("plan", GLM5, "--platform", "rocm", "--num-gpus", "8", "--set", "rollout.dp=4")
    assert bad.returncode == 2
    assert "sglang.dp_divides_engine_gpus" in bad.stderr and "dp-attention" in bad.stderr


BAD_INPUT = {
    "num_gpus zero": (["--platform", "nvidia", "--num-gpus", "0"], "gpus.positive"),
    "num_gpus text": (["--platform", "nvidia", "--num-gpus", "eight"], "gpus.positive"),
    "unknown platform": (["--platform", "tpu", "--num-gpus", "8"], "platform.known"),
    "odd async split": (["--platform", "rocm", "--num-gpus", "3"], "async.even_split"),
    "ep not dividing experts": (["--platform", "nvidia", "--num-gpus", "8", "--set", "train.ep=3"],
                                "megatron.ep_divides_experts"),
    "dp not dividing engine": (["--platform", "rocm", "--num-gpus", "8", "--set", "rollout.dp=4"],
                               "sglang.dp_divides_engine_gpus"),
    "tp not dividing heads": (["--platform", "nvidia", "--num-gpus", "8", "--set", "train.tp=3"],
                              "megatron.tp_divides_heads"),
    "empty pp stage": (["--platform", "nvidia", "--num-gpus", "8", "--set", "train.pp=8"],
                       "megatron.pp_stages_nonempty"),
    "unknown set key": (["--platform", "nvidia", "--num-gpus", "8", "--set", "train.zz=1"], "set.known_key"),
    "missing platform": (["--num-gpus", "8"], "usage"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD_INPUT)
def test_bad_input_is_one_error_line_exit_2(name):
    args, rule = BAD_INPUT[name]
    out = rlsmoke("plan", GLM5, *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert rule in lines[0] and "Traceback" not in out.stderr
    assert out.stdout == ""  # nothing half-written


def test_unknown_case():
    out = rlsmoke("plan", "glm-6", "--platform", "nvidia", "--num-gpus", "8")
    assert out.returncode == 2 and out.stderr.startswith("error: [case.known]")


def test_tp_must_divide_or_be_a_multiple_of_the_query_groups_under_gqa():
    bad = rlsmoke("plan", "glm4.5-355b-a32b-4layer", "--platform", "nvidia", "--num-gpus", "24", "--set",
                  "train.tp=12", "--set", "train.cp=1")  # fmt: skip
    assert bad.returncode == 2 and "query groups (8)" in bad.stderr
    ok = rlsmoke("plan", "glm4.5-355b-a32b-4layer", "--platform", "nvidia", "--num-gpus", "16", "--set",
                 "train.tp=16", "--set", "train.cp=1", "--set", "train.ep=16", "--head-addr", "10.0.0.1")  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_diff_generates_seed_004_table():
    out = rlsmoke(
        "plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--diff", "rocm", "--target", "miles-0.0.2"
    )
    assert out.returncode == 0
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines()[2:]}
    assert "train.py" in rows["script"] and "train_async.py" in rows["script"]
    for flag in ("--attention-backend", "--moe-enable-deepep", "--sglang-page-size", "--optimizer-cpu-offload",
                 "--sglang-disable-custom-all-reduce", "--disable-weights-backuper", "HIP_VISIBLE_DEVICES",
                 "SGLANG_NSA_FORCE_MLA", "NVTE_FUSED_ATTN", "--rollout-num-gpus"):  # fmt: skip
        assert flag in rows, flag
    assert "--num-layers" not in rows  # the model args are the same on both


def test_the_default_plan_is_miles_mains():
    nvidia = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8").stdout
    assert "--rematerialize-param-from-master-weight" in nvidia and "--disable-weights-backuper" not in nvidia
    rocm = rlsmoke("plan", GLM5, "--platform", "rocm", "--num-gpus", "8").stdout
    assert "export INDEXER_ROPE_NEOX_STYLE=0" in rocm and "export SGLANG_NSA_FORCE_MLA=1" in rocm


def test_diff_between_targets_is_what_miles_main_changed():
    out = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--diff", "miles-0.0.2")
    assert out.returncode == 0 and out.stdout.splitlines()[0].split("|")[2:] == [
        " miles-2026-08-21 ",
        " miles-0.0.2",
    ]
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:]]
        for line in out.stdout.splitlines()[2:]
    }
    assert rows == {"--context-parallel-size": ["1", "2"], "--sglang-kv-cache-dtype": ["bf16", "—"],
                    "--rematerialize-param-from-master-weight": ["(set)", "—"],
                    "--disable-weights-backuper": ["—", "(set)"]}  # fmt: skip


def test_target_renders_the_sglang_flag_dialect():
    old = json.loads(
        rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--format", "json").stdout
    )
    new = json.loads(rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--format", "json",
                             "--target", "sglang-0.5.23").stdout)  # fmt: skip
    assert "--sglang-nsa-prefill-backend" in old["argv"] and "--sglang-dsa-prefill-backend" not in old["argv"]
    assert "--sglang-dsa-prefill-backend" in new["argv"] and "--sglang-nsa-prefill-backend" not in new["argv"]


def test_shell_format_is_shell_safe(tmp_path):
    out = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8")
    script = tmp_path / "launch.sh"
    # the flow's other commands (prepare, convert, Ray's head) are stood in for by shell functions
    stubs = "rlsmoke() { :; }; torchrun() { :; }; ray() { :; }\n"
    script.write_text(stubs + out.stdout.replace("python3 train.py", "printf '%s\\n' python3 train.py"))
    tokens = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path).stdout.split(
        "\n"
    )
    assert "[0]*3+[1]*1" in tokens


def test_plan_imports_neither_torch_nor_transformers():
    code = (
        "import sys; from rlsmoke.cli import main; "
        "rc = main(['plan', 'glm5-744b-a40b-4layer', '--platform', 'rocm', '--num-gpus', '8', '--format', 'json']); "
        "heavy = [m for m in ('torch', 'transformers', 'ray') if m in sys.modules]; "
        "print('HEAVY', heavy, file=sys.stderr); sys.exit(rc or (1 if heavy else 0))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_topology_error_names_the_values_that_fix_it():
    """NUM_GPUS=6: tp*cp*pp=4 does not divide 6; `--set train.cp=1` fixes it, and the error says so."""
    import re

    seed_004 = ("--target", "miles-0.0.2")  # CP2 at 8 GPUs; Miles main's launcher has CP1
    bad = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "6", *seed_004)
    assert bad.returncode == 2 and "[megatron.world_tp_cp_pp]" in bad.stderr, bad.stderr
    fixes = re.findall(r"--set (\S+=\d+)", bad.stderr)
    assert "train.cp=1" in fixes, bad.stderr
    for value in fixes:  # every value named fixes the plan on its own
        ok = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "6", "--set", value, *seed_004)
        assert ok.returncode == 0, (value, ok.stderr)


def test_on_cpu_the_rules_are_the_plans_not_megatrons():
    bad = rlsmoke("plan", GLM5, "--platform", "cpu", "--num-gpus", "6", "--target", "miles-0.0.2")
    assert bad.returncode == 2 and bad.stderr.startswith("error: [plan.world_tp_cp_pp]"), bad.stderr
    assert "megatron" not in bad.stderr.lower() and "--set train.cp=1" in bad.stderr


def test_plan_prints_every_step_of_the_flow():
    """prepare, convert to torch_dist (unless released), Ray's head, the job: as a script and as JSON steps."""
    text = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8").stdout
    assert "torchrun --nproc-per-node 4 /root/miles/tools/convert_hf_to_torch_dist.py" in text
    assert (
        f'[ "$(cat /root/models/{GLM5}_torch_dist/latest_checkpointed_iteration.txt 2>/dev/null)" = release ] ||'
        in text
    )
    assert "ray start --head" in text and "export MILES_CI_GATE_RECORD_DIR=" in text
    plan = json.loads(
        rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "2", "--format", "json").stdout
    )
    steps = {s["name"]: s for s in plan["steps"]}
    assert list(steps) == ["prepare", "convert", "ray-head", "submit"]
    convert = steps["convert"]["command"]
    assert convert[:3] == ["torchrun", "--nproc-per-node", "2"]
    assert convert[convert.index("--save") + 1] == plan["argv"][plan["argv"].index("--ref-load") + 1]
    assert convert[convert.index("--hf-checkpoint") + 1] == steps["prepare"]["command"][4]
    submit = steps["submit"]["command"]
    assert submit[submit.index("--") + 1 :] == plan["argv"]
    assert (
        "MILES_CI_GATE_RECORD_DIR" in json.loads(submit[submit.index("--runtime-env-json") + 1])["env_vars"]
    )


def test_plan_reward_target_by_default_deepscaler_on_request():
    target = json.loads(
        rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--format", "json").stdout
    )
    argv = target["argv"]
    assert argv[argv.index("--custom-rm-path") + 1] == "rlsmoke_reward.target" and "--rm-type" not in argv
    assert target["env"]["PYTHONPATH"].endswith("/rlsmoke/engine/miles_reward")
    deep = json.loads(rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--format", "json",
                              "--reward", "deepscaler").stdout)  # fmt: skip
    assert (
        deep["argv"][deep["argv"].index("--rm-type") + 1] == "deepscaler"
        and "--custom-rm-path" not in deep["argv"]
    )
    bad = rlsmoke("plan", GLM5, "--platform", "nvidia", "--num-gpus", "8", "--reward", "none")
    assert bad.returncode == 2 and bad.stderr.startswith("error: [usage]")


@pytest.mark.parametrize(("case", "gpus", "dialect"), [(GLM5, "8", True), ("glm4.5-355b-a32b", "64", False)])
def test_the_prepare_step_is_a_command_rlsmoke_accepts(case, gpus, dialect):
    from rlsmoke.cli import build_parser

    plan = json.loads(rlsmoke("plan", case, "--platform", "nvidia", "--num-gpus", gpus, "--head-addr", "10.0.0.1",
                              "--format", "json").stdout)  # fmt: skip
    prepare = plan["steps"][0]["command"]
    args = build_parser("prepare").parse_args(prepare[1:])  # GLM-4.5 has no config dialect: no --dialect
    assert (args.case, args.out, args.dialect is not None) == (case, f"/root/models/{case}", dialect)
