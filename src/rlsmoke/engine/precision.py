"""Megatron's bf16 training on one process: a compute-dtype copy forwards and backwards, loaded as the
rollout engine loads its own, and fp32 main parameters are updated and cast back. Autocast is not the
same: it keeps the residual stream and norms in fp32 and computes the MoE router in bf16."""

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
