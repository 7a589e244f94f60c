"""Megatron's bf16 training on one process: bf16 parameters compute, fp32 main parameters are updated.

The trainer forwards and backwards through a copy of the weights in the compute dtype, loaded the
way the rollout engine loads its own (the same modules kept in fp32), so both engines run the same
cast path and differ only in kernels. Each micro-batch's gradients are added into fp32 main grads,
AdamW steps the fp32 main parameters, and the compute copy is refreshed from them, rounding as the
weight sync does. Autocast over fp32 weights is not the same thing: it leaves the residual stream,
the norms and the embedding in fp32 and computes the MoE router in bf16, where the rollout engine
keeps a bf16 residual stream and an fp32 router.
"""

from __future__ import annotations

import torch


def pairs(compute, main) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """(compute, main) parameter pairs by name; both models come from the same checkpoint."""
    mains = dict(main.named_parameters())
    return [(p, mains[name]) for name, p in compute.named_parameters()]


@torch.no_grad()
def accumulate_grads(params: list[tuple[torch.nn.Parameter, torch.nn.Parameter]]) -> None:
    """Add the compute copy's gradients into the fp32 main grads (Megatron's main_grad), then drop them."""
    for p, main in params:
        if p.grad is None:
            continue
        if main.grad is None:
            main.grad = p.grad.to(main.dtype)
        else:
            main.grad.add_(p.grad.to(main.dtype))
        p.grad = None


@torch.no_grad()
def refresh(params: list[tuple[torch.nn.Parameter, torch.nn.Parameter]]) -> None:
    """The compute copy from the updated main parameters, rounded to its dtype."""
    for p, main in params:
        p.copy_(main)
