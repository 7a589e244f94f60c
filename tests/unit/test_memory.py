"""The memory estimate: exact parameter counts (against transformers and a synthesized checkpoint),
the per-phase arithmetic against hand computations, and the fit decision the suite and `rlsmoke run` use."""

import dataclasses
import json
import math
import struct

import pytest

from rlsmoke import memory, residency
from rlsmoke.cases import Case
from rlsmoke.errors import RlsmokeError
from rlsmoke.memory import GIB, Plan, estimate
from rlsmoke.models import model_spec
from rlsmoke.models.params import parameter_count
from rlsmoke.platforms import Host
from rlsmoke.resolve import plan_for, resolve, shortfall

MODELS = ["glm5-744b-a40b-4layer", "glm5-744b-a40b-4layer-1gpu", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer",
          "glm4.5-air"]  # fmt: skip


def meta_model(spec):
    import torch

    from rlsmoke.checkpoints.synthesis import synth_config
    from rlsmoke.engine.model import model_class

    cfg = synth_config(spec, torch.float32)
    cls = model_class(spec)
    with torch.device("meta"):
        return cls.from_config(cfg) if hasattr(cls, "from_config") else cls._from_config(cfg)


def h200_run_config(gpus: int = 1):
    """`rlsmoke run ... --platform nvidia`'s RunConfig on a host of `gpus` H200s: the host is the one thing
    stood in for (there is no GPU here), given to `resolve` as the session's."""
    import argparse

    from rlsmoke.run_flags import add_run_args, case_and_session

    parser = argparse.ArgumentParser()
    add_run_args(parser)

    def config(*argv):
        case, session = case_and_session(parser.parse_args([*argv, "--platform", "nvidia"]))
        return resolve(case, dataclasses.replace(session, host=Host("nvidia", "H200", gpus)))

    return config


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "full"])
@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_is_transformers_own(name, tiny):
    spec = model_spec(name, tiny=tiny)
    model = meta_model(spec)
    count = parameter_count(spec)
    assert count.total == sum(p.numel() for p in model.parameters())
    layers = next(m for n, m in model.named_modules() if n.endswith(".layers"))
    assert count.blocks == tuple(sum(p.numel() for p in block.parameters()) for block in layers)
    assert count.largest_tensor == max(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert count.experts == experts


def safetensors_numel(folder) -> int:
    """Sum of numel over every tensor of a checkpoint, read from the safetensors headers (no torch)."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


@pytest.mark.parametrize("name", ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer"])
def test_parameter_count_matches_a_synthesized_checkpoint(name, tmp_path):
    from rlsmoke.checkpoints.synthesis import synthesize

    spec = model_spec(name, tiny=True)
    synthesize(spec, tmp_path / "ckpt", dtype="bf16", seed=0)
    assert safetensors_numel(tmp_path / "ckpt") == parameter_count(spec).total + parameter_count(spec).buffers


def test_glm5_4layer_by_hand():
    # The 256-expert MoE layer alone: 256 x 3 x 6144 x 2048 routed weights
    count = parameter_count(model_spec("glm5-744b-a40b-4layer"))
    assert count.experts == 256 * 3 * 6144 * 2048 == 9_663_676_416
    assert count.root == 2 * 154880 * 6144 + 6144
    assert count.largest_tensor == 256 * 2 * 2048 * 6144  # gate_up_proj


SMALL = Plan(world=1, train_dtype="float32", rollout_dtype="bfloat16", compute_dtype="bfloat16", offload=True,
             n_prompts=2, n_samples=4, prompt_len=64, response_len=16)  # fmt: skip


def test_one_gpu_phases_by_hand():
    spec = model_spec("glm5-744b-a40b-4layer-1gpu")
    p = parameter_count(spec).total
    est = estimate(spec, SMALL)
    # load: fp32 trainer + bf16 rollout copy
    assert est.phases["load"] == 4 * p + 2 * p
    # train (offload): master, grads, two moments and foreach AdamW's sqrt temporary, all fp32
    assert est.terms["train"] == {"master": 4 * p, "compute copy": 0, "grads": 4 * p, "AdamW moments": 8 * p,
                                  "AdamW temporary": 4 * p, "rollout copy": 0}  # fmt: skip
    assert est.peak == est.phases["train"] == 20 * p and est.peak_phase == "train"
    # without offload the rollout copy stays through the step
    assert estimate(spec, Plan(**{**SMALL.__dict__, "offload": False})).peak == 22 * p


def test_one_gpu_compute_copy_and_fused_step_by_hand():
    # What a GPU run holds on one device: a bf16 compute copy over the fp32 master, the fused AdamW step
    spec = model_spec("glm5-744b-a40b-4layer-1gpu")
    p = parameter_count(spec).total
    est = estimate(spec, Plan(**{**SMALL.__dict__, "compute_copy": True, "fused_adamw": True}))
    assert est.phases["load"] == 4 * p + 2 * p + 2 * p  # master, compute copy, rollout copy
    assert est.terms["train"] == {"master": 4 * p, "compute copy": 2 * p, "grads": 4 * p, "AdamW moments": 8 * p,
                                  "AdamW temporary": 0, "rollout copy": 0}  # fmt: skip
    assert est.peak == 18 * p


# The GPU runs' shape (seed 004): one group of 8 samples at a time, 64 prompt tokens budgeted (the
# fixture prompts are 22-47 tokens under the chat template), 100 response tokens.
GPU_SHAPE = Plan(**{**SMALL.__dict__, "n_prompts": 8, "n_samples": 8, "response_len": 100,
                    "compute_copy": True, "fused_adamw": True})  # fmt: skip


def test_rollout_phase_by_hand():
    seq = 64 + 100
    # GLM-5 (MLA + DSA): 64 heads x (192 nope + 64 rope key + 256 value) + the indexer's 128-wide key, bf16,
    # 4 layers plus one layer's copy while the cache grows
    glm5 = model_spec("glm5-744b-a40b-4layer-1gpu")
    kv = 8 * seq * (64 * (192 + 64 + 256) + 128) * 2 * (4 + 1)
    experts = 8 * 8 * 3 * 2048 * 6144 * 2  # batched_mm decode: 8 tokens x top-8 gate_up + down, bf16
    logits = 8 * 154880 * (2 + 4 * 4)  # next-token logits (bf16) and four float32 (n, V) of them
    assert (kv, experts, logits) == (431_595_520, 4_831_838_208, 22_302_720)
    est = estimate(glm5, GPU_SHAPE)
    p = parameter_count(glm5).total
    assert est.terms["rollout"] == {"rollout copy": 2 * p, "rollout working set": kv + experts + logits}
    # GLM-4.5 (GQA): a key and a value for each of 8 query groups of 128
    glm45 = model_spec("glm4.5-355b-a32b-4layer")
    kv = 8 * seq * (2 * 8 * 128) * 2 * (4 + 1)
    experts = 8 * 8 * 3 * 1536 * 5120 * 2
    logits = 8 * 151552 * (2 + 4 * 4)
    assert (
        estimate(glm45, GPU_SHAPE).terms["rollout"]["rollout working set"]
        == kv + experts + logits
        == 3_068_592_128
    )
    # the group, not the batch: more prompts sample one group after another
    assert (
        estimate(glm5, Plan(**{**GPU_SHAPE.__dict__, "n_prompts": 64})).phases["rollout"]
        == est.phases["rollout"]
    )


def test_fsdp_shards_the_train_state_not_the_rollout_copy():
    spec = model_spec("glm5-744b-a40b-4layer")
    count = parameter_count(spec)
    p = count.total
    two = estimate(spec, Plan(**{**SMALL.__dict__, "world": 2}))
    half = -(-4 * p // 2)
    assert two.terms["train"]["master"] == half and two.terms["train"]["AdamW moments"] == 2 * half
    assert two.terms["rollout"]["rollout copy"] == 2 * p  # every rank holds a full copy
    assert two.terms["load"] == {
        "master": half,
        "block being sharded": 4 * max(count.blocks),
        "rollout copy": 2 * p,
    }
    four = estimate(spec, Plan(**{**SMALL.__dict__, "world": 4}))
    assert four.terms["train"]["master"] == -(-4 * p // 4)


def test_the_measured_two_gpu_oom_is_predicted_and_offload_fixes_it():
    """Two H200s ran GLM-5 4-layer (256 experts) without offload and ran out of memory after loading."""
    h200 = 141 * memory.USABLE_FRACTION * GIB
    spec = model_spec("glm5-744b-a40b-4layer")
    without = estimate(spec, Plan(**{**SMALL.__dict__, "world": 2, "offload": False}))
    with_offload = estimate(spec, Plan(**{**SMALL.__dict__, "world": 2, "offload": True}))
    assert without.peak > h200 > with_offload.peak
    assert estimate(spec, SMALL).peak > h200  # one GPU: all 256 experts never fit


def test_async_is_the_larger_of_trainer_and_rollout_gpu():
    spec = model_spec("glm4.5-355b-a32b-4layer")
    p = parameter_count(spec).total
    est = estimate(spec, Plan(**{**SMALL.__dict__, "mode": "async"}))
    assert est.phases["train"] >= 20 * p and est.terms["train"]["rollout copy"] == 0
    assert est.phases["rollout"] >= 2 * p


def test_shortfall_names_the_numbers():
    h200 = Host("nvidia", "H200", 1)
    reason = shortfall(Case("glm5.3-flash-4layer", platform="nvidia", num_gpus=1), h200)
    assert "GiB per GPU at train" in reason and "141 GiB" in reason and "--num-gpus" in reason
    assert shortfall(Case("glm5.3-flash-4layer", platform="nvidia", num_gpus=2), h200) == ""
    assert shortfall(Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=2), h200) == ""
    assert shortfall(Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=1), h200) != ""
    assert shortfall(Case("glm5-744b-a40b-4layer-1gpu", platform="nvidia", num_gpus=1), h200) == ""
    assert shortfall(Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True), h200) == ""


def test_no_torch_import():
    import subprocess
    import sys

    code = ("import sys, rlsmoke.memory as m; from rlsmoke.models import model_spec; "
            "m.estimate(model_spec('glm5-744b-a40b-4layer'), m.Plan()); assert 'torch' not in sys.modules")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rlsmoke_run_refuses_a_case_that_cannot_fit_before_loading():
    from rlsmoke.engine.config import RunConfig

    gpu = RunConfig(case="glm5-744b-a40b-4layer", tiny=False, platform="nvidia", device="cuda", device_class="H200",
                    rollout_dtype="bfloat16")  # fmt: skip
    with pytest.raises(RlsmokeError) as err:
        residency.check_run_fits(gpu)
    assert (
        err.value.rule == "memory.fits" and "GiB per GPU" in str(err.value) and "--num-gpus" in err.value.fix
    )
    two = gpu.replace(num_gpus=2, n_prompts=2)
    assert residency.check_run_fits(two).peak < 141 * GIB
    with pytest.raises(RlsmokeError) as err:  # the measured OOM: two H200s without offload
        residency.check_run_fits(two.replace(offload=False))
    assert "--offload" in err.value.fix


def test_offload_is_skipped_only_when_the_run_fits_resident_with_room():
    """Seed 004's shape on one H200: GLM-5 4-layer stays resident (107 of 141 GiB), GLM-4.5 4-layer
    (120 GiB, past 80 %) offloads, and so do several GPUs, an unknown device; CPU and async have none."""
    from rlsmoke.engine.config import RunConfig

    def h200(case, **kw):
        return RunConfig(case=case, tiny=False, platform="nvidia", device="cuda", device_class="H200",
                         rollout_dtype="bfloat16", n_prompts=8, n_samples=8, max_response_len=100, **kw)  # fmt: skip

    glm5, glm45 = h200("glm5-744b-a40b-4layer-1gpu"), h200("glm4.5-355b-a32b-4layer")
    resident = memory.estimate(
        model_spec(glm5.case), dataclasses.replace(memory.plan_of_run(glm5), offload=False)
    )
    assert resident.peak < residency.RESIDENT_FRACTION * 141 * GIB
    assert not residency.offload_needed(glm5)
    assert residency.offload_needed(glm45)
    assert residency.offload_needed(glm5.replace(device_class="GPU-not-in-the-table"))
    assert not residency.offload_needed(glm5.replace(mode="async", num_gpus=2))
    two = h200("glm4.5-355b-a32b-4layer", num_gpus=2)  # 72 GiB resident, but FSDP2's peak is unmeasured
    assert residency.offload_needed(two)
    assert not residency.offload_needed(glm5.replace(device="cpu"))


def test_rlsmoke_run_resolves_the_offload_default_before_loading(monkeypatch):
    """`rlsmoke run`'s config has a concrete offload before anything loads (the summary records it)."""
    run_config = h200_run_config()

    def offload(*argv):
        return run_config(*argv).offload

    assert offload("glm5-744b-a40b-4layer-1gpu") is False
    assert offload("glm4.5-355b-a32b-4layer") is True
    assert offload("glm5-744b-a40b-4layer-1gpu", "--offload") is True
    assert offload("glm4.5-355b-a32b-4layer", "--no-offload", "--max-response-len", "16") is False


def test_where_the_rollout_fits_beside_the_train_state_only_the_rollout_copy_moves(monkeypatch):
    """GLM-4.5 4-layer on one H200 (seed 004's shape): resident it needs 120 GiB, past 80 %; with only the
    rollout copy taking turns its peak is the step's 108 GiB, as with the whole offload, and its rollout
    phase (99 GiB) holds the train state beside the copy. `rlsmoke run` resolves that before loading; --offload
    keeps Miles' meaning (both sides move), and --no-offload-train asks for the copy's turns alone."""
    spec = model_spec("glm4.5-355b-a32b-4layer")
    plan = plan_for(Case("glm4.5-355b-a32b-4layer", platform="nvidia"), kda="reference")
    full, copy_only = (
        memory.estimate(spec, plan),
        memory.estimate(spec, dataclasses.replace(plan, offload_train=False)),
    )
    assert copy_only.peak == full.peak <= residency.RESIDENT_FRACTION * 141 * GIB
    assert copy_only.peak_phase == "train"
    assert {"master", "compute copy", "AdamW moments"} <= copy_only.terms["rollout"].keys()
    assert "master" not in full.terms["rollout"]
    assert copy_only.phases["rollout"] > full.phases["rollout"]

    run_config = h200_run_config()

    def offloads(*argv):
        cfg = run_config(*argv)
        return cfg.offload_active, cfg.offload_train_active

    assert offloads("glm4.5-355b-a32b-4layer") == (True, False)
    assert offloads("glm4.5-355b-a32b-4layer", "--offload") == (True, True)
    assert offloads("glm4.5-355b-a32b-4layer", "--offload", "--no-offload-train") == (True, False)
    assert offloads("glm5-744b-a40b-4layer-1gpu") == (False, False)
    # where the rollout beside the train state (99 GiB) would pass the resident fraction, both sides move
    monkeypatch.setattr(residency, "RESIDENT_FRACTION", 0.7)
    assert offloads("glm4.5-355b-a32b-4layer") == (True, True)


@pytest.mark.parametrize("gpus", [1, 2, 3])
def test_the_suite_s_estimate_and_rlsmoke_run_s_read_the_same_batch(monkeypatch, gpus):
    """The suite decides a skip from `plan_for`; `rlsmoke run` refuses from its RunConfig: one shape."""
    name = "glm4.5-355b-a32b-4layer"
    cfg = h200_run_config(gpus)(name, "--num-gpus", str(gpus), "--set", "train.cp=1")
    run, suite = memory.plan_of_run(cfg), plan_for(Case(name, platform="nvidia", num_gpus=gpus))
    assert (run.n_prompts, run.n_samples, run.response_len) == (
        suite.n_prompts,
        suite.n_samples,
        suite.response_len,
    )


def test_initial_weights_on_the_device_are_counted_in_every_phase_and_kept_there_only_with_room(monkeypatch):
    """--repeat / --variants on one H200: GLM-5 4-layer keeps its initial weights on the device (a bf16
    copy, 2 bytes a parameter, in every phase's estimate); a batch that leaves no room keeps them in host
    memory; `rlsmoke run` resolves it with the offload, before anything loads, and only when it keeps them."""
    spec = model_spec("glm5-744b-a40b-4layer-1gpu")
    plan = plan_for(Case("glm5-744b-a40b-4layer-1gpu", platform="nvidia"), offload=False)
    without, kept = (
        memory.estimate(spec, plan),
        memory.estimate(spec, dataclasses.replace(plan, initial_on_device=True)),
    )
    assert all(kept.phases[p] - without.phases[p] == 2 * without.params for p in memory.PHASES)
    assert all(kept.terms[p]["initial weights"] == 2 * without.params for p in memory.PHASES)

    run_config = h200_run_config()

    def on_device(*argv):
        return run_config(*argv).initial_on_device

    assert on_device("glm5-744b-a40b-4layer-1gpu", "--repeat", "3") is True
    assert on_device("glm5-744b-a40b-4layer-1gpu", "--variants", "clean,stale-weights") is True
    assert on_device("glm5-744b-a40b-4layer-1gpu") is False  # one run: nothing is kept
    # a batch whose step (offloaded: 120.2 GiB) leaves less than the copy's 10.7 GiB of the usable 129.7
    long = ("--repeat", "2", "--max-response-len", "1700")
    cfg = run_config("glm5-744b-a40b-4layer-1gpu", *long)
    est = memory.estimate(spec, memory.plan_of_run(cfg))
    assert cfg.offload and est.peak <= residency.usable_gib("H200") * GIB < est.peak + 2 * est.params
    assert cfg.initial_on_device is False
