"""The log-prob slope: how the train-minus-rollout log-prob gap grows with the token's log-prob.

A temperature on one side only gives `logp_1 = T * logp_T + c`: the gap moves with the log-prob at slope
`T - 1` (-0.2 at 0.8), while rounding noise between engines averages out of a least-squares slope.
"""

from __future__ import annotations

import torch

SLOPE = "train/train_rollout_logprob_slope"


def logprob_slope(train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Least-squares slope of (train - rollout) on the rollout log-prob over the masked tokens. (n, R) -> ()"""
    valid = (mask > 0) & torch.isfinite(train_lp) & torch.isfinite(rollout_lp)
    x = rollout_lp[valid].double()
    y = (train_lp[valid] - rollout_lp[valid]).double()
    if x.numel() < 2:
        return torch.tensor(0.0)
    dx = x - x.mean()
    var = (dx * dx).sum()
    return ((dx * (y - y.mean())).sum() / var).float() if var > 0 else torch.tensor(0.0)


def batch_slope(groups, train_lps: list[torch.Tensor]) -> float:
    """The slope over every response token of a rollout's groups at once."""
    train = torch.cat([t.flatten() for t in train_lps])
    rollout = torch.cat([g.rollout_logprobs.flatten() for g in groups])
    return logprob_slope(train, rollout, torch.cat([g.mask.flatten() for g in groups])).item()
