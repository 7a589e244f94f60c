"""Weight sync: trainer -> rollout engine, then a bitwise check in the rollout dtype per parameter, like
Miles' --ci-test weight check."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def rollout_weights(model, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's parameters as the rollout engine should hold them."""
    return ((name, p.detach().to(dtype)) for name, p in model.named_parameters())


@torch.no_grad()
def load_and_compare(
    model, weights: Iterable[tuple[str, torch.Tensor]], *, load: bool = True
) -> dict[str, float]:
    """Copy each weight in (`load=False`: compare only), then count the parameters that differ (and the
    max abs diff): a missing name or shape mismatches, and so does a parameter no weight names."""
    params = dict(model.named_parameters())
    mismatched, max_diff, seen = 0, 0.0, set()
    for name, tensor in weights:
        seen.add(name)
        if (mine := params.get(name)) is None or mine.shape != tensor.shape:
            mismatched += 1
            max_diff = float("inf")
            continue
        if load:
            mine.copy_(tensor.to(mine.device))
        tensor = tensor.to(mine.device, mine.dtype)
        if not torch.equal(mine, tensor):
            mismatched += 1
            max_diff = max(max_diff, (mine.float() - tensor.float()).abs().max().item())
    mismatched += len(set(params) - seen)  # the engine holds a parameter the trainer does not
    return {"sync/checked_params": float(len(seen)), "sync/mismatched_params": float(mismatched),
            "sync/max_abs_diff": max_diff}  # fmt: skip
