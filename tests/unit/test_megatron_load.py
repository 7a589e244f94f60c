"""The megatron trainer's load, pinned to its values: what it holds after the load is the bridge's output
of the checkpoint, bit for bit, as when every tensor was cast to the main dtype first and copied again.

A case: tiny GLM-5 (MLA, DSA indexer, MoE with an fp32 expert bias), at the CPU's fp32 compute and at the
GPU's bf16 compute over fp32 main parameters. The load now moves the checkpoint's bf16 tensors through
the bridge uncast, skips the NaN fill of memory it overwrites, and hands its read to the rollout copy.
Gates: the compute parameters, the main parameters and the expert bias equal the bridge's output of the
checkpoint cast to fp32 (the old rule) in their dtypes; no trainer tensor shares storage with the read the
rollout copy is built from; that rollout copy equals a fresh load from the files; a tensor the bridge
passed through untouched is copied (`_owned`), and one it made is not copied again.
"""

from __future__ import annotations

import pytest
import torch

from rlsmoke.engine import megatron

pytestmark = [
    pytest.mark.cpu,
    pytest.mark.skipif(
        not megatron.available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"
    ),
]

CASE_NAME = "glm5-744b-a40b-4layer"


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def _loaded(rank, par, compute_dtype):
    """In a rank of its own (the pytest process keeps no process group): the load against the old rule."""
    from rlsmoke.bridge.convert import hf_to_megatron
    from rlsmoke.checkpoints import prepare
    from rlsmoke.engine.config import RunConfig
    from rlsmoke.engine.megatron.trainer import MegatronTrainWorker
    from rlsmoke.engine.model import load_policy, process_settings
    from rlsmoke.engine.read import read_checkpoint

    process_settings(None)
    ckpt = prepare(CASE_NAME, tiny=True)
    cfg = RunConfig(case=CASE_NAME, tiny=True, trainer="megatron", compute_dtype=compute_dtype)
    worker = MegatronTrainWorker(cfg, ckpt)
    trainer, spec = worker.trainer, cfg.spec
    # the old rule: every checkpoint tensor cast to the main dtype, then through the bridge
    ref = hf_to_megatron({k: v.float() for k, v in read_checkpoint(ckpt, "cpu").items()}, spec,
                         vocab_size=trainer.gpt.vocab_size)  # fmt: skip
    params = dict(trainer.gpt.named_parameters())
    buffers = {n: b for n, b in trainer.gpt.named_buffers() if n.endswith("expert_bias")}
    mains = dict(zip(params, trainer.master.parameters(), strict=True))
    read = worker.take_checkpoint()
    fresh = load_policy(ckpt, spec, "float32", "cpu")
    from_read = load_policy(ckpt, spec, "float32", "cpu", state=read)
    trainer_storages = _storages([*params.values(), *buffers.values(), *mains.values()])
    return {
        "checkpoint_dtypes": {str(v.dtype) for v in read.values()},
        "compute": [n for n, p in params.items() if not torch.equal(p, ref[n].to(p.dtype))],
        "compute_dtypes": {str(p.dtype) for p in params.values()},
        "main": [n for n, m in mains.items() if not (m.dtype == torch.float32 and torch.equal(m, ref[n]))],
        "expert_bias": [n for n, b in buffers.items() if not (b.dtype == torch.float32 and torch.equal(b, ref[n]))],
        "expert_biases": len(buffers),
        "shared_with_read": len(trainer_storages & _storages(read.values())),
        "main_shares_compute": len(_storages(mains.values()) & _storages(params.values())),
        "taken_twice": worker.take_checkpoint(),
        "rollout_differs": [n for n, p in from_read.named_parameters() if not torch.equal(p, fresh.get_parameter(n))],
        "rollout_buffers_differ": [n for n, b in from_read.named_buffers() if not torch.equal(b, fresh.get_buffer(n))],
    }  # fmt: skip


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_the_load_holds_the_bridges_values_bit_for_bit_and_lends_its_read_to_the_rollout(compute_dtype):
    from megatron_ranks import run_ranks

    from rlsmoke.engine.megatron.dist import Parallel

    [got] = run_ranks(_loaded, Parallel(), compute_dtype)
    # bf16 tensors (the prepared checkpoint's weights) take the uncast path, fp32 ones (its expert bias) the copy
    assert got["checkpoint_dtypes"] <= {"torch.bfloat16", "torch.float32"}
    assert got["compute_dtypes"] == {f"torch.{compute_dtype}"}
    assert got["compute"] == [] and got["main"] == []
    assert got["expert_biases"] > 0 and got["expert_bias"] == []
    assert got["shared_with_read"] == 0 and got["main_shares_compute"] == 0
    assert got["taken_twice"] is None  # the read goes to one rollout copy, then is the worker's no more
    assert got["rollout_differs"] == [] and got["rollout_buffers_differ"] == []


def test_a_tensor_the_bridge_passed_through_is_copied_and_one_it_cast_is_not():
    from rlsmoke.engine.megatron.trainer import _owned

    checkpoint = {"bias": torch.arange(4.0), "weight": torch.arange(4.0).to(torch.bfloat16)}
    borrowed = _storages(checkpoint.values())
    bias = _owned(checkpoint["bias"], torch.float32, borrowed)  # fp32 into fp32: `.to` returns it as is
    assert torch.equal(bias, checkpoint["bias"]) and bias.untyped_storage().data_ptr() not in borrowed
    weight = _owned(checkpoint["weight"], torch.float32, borrowed)
    assert weight.dtype == torch.float32 and weight.untyped_storage().data_ptr() not in borrowed
    made = checkpoint["weight"].float() * 1  # a tensor the bridge made: its own already
    assert _owned(made, torch.float32, borrowed) is made
    # the twin: without the check, the pass-through would alias the checkpoint's tensor
    assert checkpoint["bias"].to(torch.float32).untyped_storage().data_ptr() in borrowed


def test_unfilled_leaves_the_nan_fill_off_only_inside_and_as_it_was_after():
    import torch.utils.deterministic as det

    from rlsmoke.engine.read import unfilled

    before, filled = torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    det.fill_uninitialized_memory = True  # torch's default, whatever ran in this process before
    try:
        assert torch.empty(8).isnan().all()  # deterministic mode fills what torch.empty hands out
        with unfilled():
            assert det.fill_uninitialized_memory is False
        assert det.fill_uninitialized_memory is True and torch.empty(8).isnan().all()
        with pytest.raises(RuntimeError), unfilled():
            raise RuntimeError("a failed build")
        assert det.fill_uninitialized_memory is True
    finally:
        torch.use_deterministic_algorithms(before)
        det.fill_uninitialized_memory = filled
