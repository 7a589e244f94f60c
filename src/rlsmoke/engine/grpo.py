"""GRPO: group advantages, the PPO clip loss, and the metrics with Miles' keys and definitions, plus the
log-prob slope: a temperature on one side only gives `logp_1 = T * logp_T + c`, so the train-minus-rollout gap
grows with the log-prob at slope `T - 1` (-0.2 at 0.8), while rounding noise between engines averages out of
a least-squares slope."""

from __future__ import annotations

import torch

# Miles' low_var_kl (loss_hub/math_utils.py) clamps the log-ratio to +-20 and the estimate to +-10.
LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0
SLOPE = "train/train_rollout_logprob_slope"


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within each prompt group. rewards: (G, n) -> (G, n)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def sample_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean within each sample, then across samples; masked and NaN tokens count 0. (n, R) -> ()"""
    x = torch.where((mask > 0) & torch.isfinite(x), x, torch.zeros_like(x))
    return (x.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def k3(logp: torch.Tensor, logp_base: torch.Tensor) -> torch.Tensor:
    """Miles' compute_approx_kl(logp, logp_base, "low_var_kl"): exp(r) - 1 - r, r = logp_base - logp."""
    r = torch.nan_to_num((logp_base - logp).float(), nan=0.0, posinf=LOG_RATIO_CLAMP, neginf=-LOG_RATIO_CLAMP)
    r = r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(r) - 1 - r).clamp(-KL_CLAMP, KL_CLAMP)


def train_rollout_stats(
    train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """The train-vs-rollout log-prob metrics over one batch. All inputs (n, R)."""
    diff = (train_lp - rollout_lp).abs()
    valid = (mask > 0) & torch.isfinite(diff)
    return {
        "train/train_rollout_logprob_abs_diff": sample_mean(diff, mask).item(),
        # the mean hides tails: a few tokens dominate real regressions
        "train/train_rollout_logprob_abs_diff_max": diff[valid].max().item() if valid.any() else 0.0,
        # KL(rollout || train), as Miles' policy loss logs it (loss_hub/losses.py)
        "train/train_rollout_kl": sample_mean(k3(rollout_lp, train_lp), mask).item(),
    }


def policy_loss(logp, old_logp, advantages, mask, eps_clip: float, eps_clip_high: float):
    """Token-level PPO clip loss (n, R) and the masked per-token clip and ppo_kl terms."""
    log_ratio = logp - old_logp  # (n, R)
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None]  # (n, 1)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    loss = torch.maximum(pg1, pg2)  # (n, R)
    clipped = (pg2 > pg1).float()  # (n, R)
    return loss * mask, clipped * mask, -log_ratio.detach() * mask  # ppo_kl = old - new


def logprob_slope(train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Least-squares slope of (train - rollout) on the rollout log-prob over masked tokens. (n, R) -> ()"""
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
