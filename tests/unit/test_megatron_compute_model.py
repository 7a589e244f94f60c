"""The megatron trainer at the GPU's dtypes on CPU: bf16 compute params over fp32 main params, no autocast.

A case: tiny GLM-5 (sigmoid router with expert bias, MoE layer 3), rolled out in bf16, trained with a
bf16 compute dtype over fp32 master weights, as `rlsmoke run --platform nvidia` does.
A run: one GRPO step and a sync, with CUDA autocast's policy for `sum` (fp32 out of bf16 in) forced
onto CPU autocast. CPU autocast keeps `sum` in bf16, which is why CI never saw a trainer built in
fp32 and run under autocast crash in megatron-core's routing (`index_put_`: Float vs BFloat16) as it
did on the H200.
Gates: the run completes without autocast ever turning on; the GPTModel holds bf16 parameters, an
fp32 expert bias and routes in fp32; the main parameters are fp32; the sync is exact; train and
rollout log-probs agree within the H200 gate of the same dtypes.
"""

from __future__ import annotations

import json

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


class CudaAutocastSum:
    """CUDA autocast runs `sum` in fp32; CPU autocast does not. While CPU autocast is on, give `sum`
    CUDA's result dtype, and count the calls made under autocast. Only `sum` is wrapped: a mode that
    sees every torch call would cost seconds here."""

    def __init__(self):
        self.under_autocast = 0
        self._originals = {}

    def _wrap(self, func):
        def cuda_sum(x, *args, **kwargs):
            if torch.is_autocast_enabled("cpu"):
                self.under_autocast += 1
                if (
                    isinstance(x, torch.Tensor)
                    and x.dtype in (torch.bfloat16, torch.float16)
                    and "dtype" not in kwargs
                ):
                    return func(x.float(), *args, **kwargs)
            return func(x, *args, **kwargs)

        return cuda_sum

    def __enter__(self):
        for owner in (torch, torch.Tensor):
            self._originals[owner] = owner.sum
            owner.sum = self._wrap(owner.sum)
        return self

    def __exit__(self, *exc):
        for owner, func in self._originals.items():
            owner.sum = func


def _config(**changes):
    from rlsmoke.engine.config import RunConfig

    return RunConfig(case=CASE_NAME, tiny=True, trainer="megatron", rollout_dtype="bfloat16", compute_dtype="bfloat16",
                     n_prompts=1, n_samples=4, max_response_len=8, **changes)  # fmt: skip


# Each runs in a rank of its own (world size 1, as the colocated trainer): the pytest process then
# holds no process group, whose threads would keep every later rank from forking.


def _step_under_cuda_sum(rank, par, out):
    from rlsmoke.engine.run import execute

    mode = CudaAutocastSum()
    with mode:
        summary = execute(_config(), out)  # the old trainer raised here, in topk_routing_with_score_function
    return mode.under_autocast, summary["dtype"]


def test_the_megatron_trainer_steps_at_the_gpu_dtypes_without_autocast(tmp_path):
    from megatron_ranks import run_ranks

    from rlsmoke.engine.megatron.dist import Parallel
    from rlsmoke.runkey import RunKey
    from rlsmoke.thresholds import lookup_gates

    [(under_autocast, dtype)] = run_ranks(_step_under_cuda_sum, Parallel(), tmp_path)
    assert under_autocast == 0
    assert dtype == {"rollout": "bfloat16", "train": "float32", "compute": "bfloat16"}
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step0, step1 = (s["metrics"] for s in steps if s["kind"] == "step")
    assert step0["sync/mismatched_params"] == 0
    # the H200 gate of the same dtypes (tiny GLM-5): what the GPU run will be held to
    h200 = RunKey(CASE_NAME, "nvidia", "H200", "builtin", "bfloat16/float32", "tiny")
    bound = {g.name: g.bound for g in lookup_gates(h200)}["logprob_abs_diff"]
    for step in (step0, step1):  # before the update, and after the sync
        assert 0 < step["train/train_rollout_logprob_abs_diff"] < bound


def test_the_cuda_sum_policy_counts_and_upcasts_sums_under_cpu_autocast_only():
    """The twin of the step's instrument: under autocast a bf16 sum is counted and comes out fp32."""
    x = torch.ones(3, dtype=torch.bfloat16)
    before = (torch.sum, torch.Tensor.sum)
    with CudaAutocastSum() as policy:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = (x.sum().dtype, torch.sum(x, dim=0).dtype)
        outside = x.sum().dtype
    assert policy.under_autocast == 2 and under == (torch.float32, torch.float32)
    assert outside == torch.bfloat16 and (torch.sum, torch.Tensor.sum) == before  # put back as it was


def _built_dtypes(rank, par):
    from rlsmoke.checkpoints import prepare
    from rlsmoke.engine.megatron.trainer import MegatronTrainWorker

    trainer = MegatronTrainWorker(_config(), prepare(CASE_NAME, tiny=True)).trainer
    gpt = trainer.gpt
    return {
        "bf16": gpt.config.bf16,
        "params_dtype": gpt.config.params_dtype,
        "router_dtype": gpt.config.moe_router_dtype,
        "param_dtypes": {p.dtype for p in gpt.parameters()},
        "expert_bias_dtypes": [b.dtype for n, b in gpt.named_buffers() if n.endswith("router.expert_bias")],
        "main_dtypes": {p.dtype for p in trainer.master.parameters()},
        # the main params are the unrounded checkpoint values; the compute copy is them in bf16
        "compute_is_main_in_bf16": all(torch.equal(p, m.to(torch.bfloat16)) for p, m in trainer._pairs),
        "main_differs_from_compute": sum(not torch.equal(p.float(), m) for p, m in trainer._pairs),
    }


def test_the_gptmodel_is_built_in_bf16_with_an_fp32_router_over_fp32_main_params():
    from megatron_ranks import run_ranks

    from rlsmoke.engine.megatron.dist import Parallel

    [built] = run_ranks(_built_dtypes, Parallel())
    assert built["bf16"] and built["params_dtype"] == torch.bfloat16
    assert built["router_dtype"] == "fp32"
    assert built["param_dtypes"] == {torch.bfloat16}
    assert built["expert_bias_dtypes"] and set(built["expert_bias_dtypes"]) == {torch.float32}
    assert built["main_dtypes"] == {torch.float32}
    assert built["compute_is_main_in_bf16"] and built["main_differs_from_compute"] > 0


@pytest.mark.parametrize(("device", "on_host"), [("cpu", True), ("cuda:0", False)])
def test_the_gptmodel_is_allocated_where_it_trains_not_on_the_host_and_copied(device, on_host):
    """On a GPU megatron-core allocates each parameter on the device, uninitialized (the checkpoint fills
    it); built on the host and copied, GLM-5 4-layer's load took 3.3-5.4 s longer on an H200."""
    from rlsmoke.engine.megatron.dist import Parallel
    from rlsmoke.engine.megatron.model import transformer_config
    from rlsmoke.models import model_spec

    spec = model_spec(CASE_NAME, tiny=True)
    config = transformer_config(spec, Parallel(), params_dtype=torch.bfloat16, device=device)
    assert config.use_cpu_initialization is on_host
    assert config.perform_initialization is False
