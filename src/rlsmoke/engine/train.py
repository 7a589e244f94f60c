"""The train step: a forward-only pass for the old log-probs, then loss, backward, clip and AdamW."""

from __future__ import annotations

import math

import torch

from rlsmoke.engine import grpo, precision
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.model import TORCH_DTYPES
from rlsmoke.engine.offload import local_shard
from rlsmoke.engine.rollout import Group
from rlsmoke.errors import RunError


def token_logprobs(model, group: Group, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob and entropy at the rollout temperature, as Miles' logit processor divides."""
    tokens = group.tokens.to(next(model.parameters()).device)  # (n, P+R)
    logits = model(input_ids=tokens, use_cache=False).logits  # (n, P+R, V)
    logits = logits[:, group.prompt_len - 1 : -1].float()  # (n, R, V) the positions predicting the response
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, tokens[:, group.prompt_len :, None])[..., 0]  # (n, R)
    return logp, -(logp_all.exp() * logp_all).sum(-1)  # and the entropy (n, R)


def trainer_options(cfg: RunConfig) -> dict:
    """The `Trainer` settings every train side takes from the run's config as they are."""
    return dict(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high, entropy_coef=cfg.entropy_coef,
                gradient_checkpointing=cfg.gradient_checkpointing, temperature=cfg.rollout_temperature,
                compute_dtype=TORCH_DTYPES[cfg.train_compute_dtype])  # fmt: skip


# The per-token sums a step reports, each divided by the step's token count (Miles' train/ keys).
STEP_SUMS = ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy_loss", "kl_loss")


def group_loss(logp, entropy, mask, old_lp, adv, *, eps_clip: float, eps_clip_high: float,
               entropy_coef: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """One group's token-summed loss (PPO clip less the entropy bonus) and its sums for the metrics."""
    loss_tok, clipped, ppo_kl = grpo.policy_loss(logp, old_lp, adv, mask, eps_clip, eps_clip_high)
    sums = {"pg_loss": loss_tok.sum(), "pg_clipfrac": clipped.sum(), "ppo_kl": ppo_kl.sum(),
            "entropy_loss": (entropy.detach() * mask).sum()}  # fmt: skip
    return loss_tok.sum() - entropy_coef * (entropy * mask).sum(), sums


class StepSums:
    """A step's per-group losses and metric sums, kept on the device until the groups are done: reading
    them group by group made the host wait for each forward before it could launch its backward."""

    def __init__(self) -> None:
        self._groups: list[tuple[Group, torch.Tensor, dict[str, torch.Tensor]]] = []

    def add(self, group: Group, loss: torch.Tensor, sums: dict[str, torch.Tensor]) -> None:
        self._groups.append((group, loss.detach(), sums))

    def totals(self) -> dict[str, float]:
        """The sums over the groups, added in Python group by group; `train.finite_loss` names the first
        group whose loss was not finite. Call it before the grads are read."""
        totals = dict.fromkeys(STEP_SUMS, 0.0)
        if not self._groups:
            return totals
        keys = list(self._groups[0][2])
        rows = [torch.stack([loss for _, loss, _ in self._groups]).tolist()]
        rows += [torch.stack([sums[k] for _, _, sums in self._groups]).tolist() for k in keys]
        for (group, _, _), loss in zip(self._groups, rows[0], strict=True):
            if not math.isfinite(loss):
                raise RunError(f"loss is {loss} on group {group.prompt_index}", rule="train.finite_loss")
        for k, values in zip(keys, rows[1:], strict=True):
            for v in values:
                totals[k] += v
        return totals


def step_metrics(sums: dict[str, float], total_tokens: float, *, grad_norm: float, lr: float, changed: float,
                 count: float) -> dict[str, float]:  # fmt: skip
    """A step's metrics under Miles' keys."""
    metrics = {f"train/{k}": v / total_tokens for k, v in sums.items()}
    metrics["train/loss"] = metrics["train/pg_loss"]
    metrics["train/grad_norm"] = grad_norm
    metrics["train/lr"] = lr
    metrics["train/updated_params_frac"] = changed / count
    return metrics


def set_dropout(model, p: float | None) -> None:
    """--inject train-dropout=P: attention dropout left on in training. None: the built value, back."""
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            if not hasattr(module, "built_attention_dropout"):
                module.built_attention_dropout = module.attention_dropout
            module.attention_dropout = module.built_attention_dropout if p is None else p


class Trainer:
    def __init__(self, model, *, lr: float, betas: tuple[float, float], weight_decay: float, grad_clip: float,
                 eps_clip: float, eps_clip_high: float, entropy_coef: float = 0.0, kl_coef: float = 0.0,
                 ref_model=None, gradient_checkpointing: bool = False,
                 compute_dtype: torch.dtype | None = None, compute_model=None, temperature: float = 1.0):  # fmt: skip
        self.temperature = temperature  # the rollout temperature: log-probs of what was sampled
        # the compute-dtype weights are forwarded while `model` holds the fp32 main params (engine.precision)
        self.master = model
        self.model = model if compute_model is None else compute_model
        self._pairs = [] if compute_model is None else precision.pairs(compute_model, model)
        self.grad_clip, self.eps_clip, self.eps_clip_high = grad_clip, eps_clip, eps_clip_high
        self.entropy_coef, self.kl_coef, self.ref_model = entropy_coef, kl_coef, ref_model
        # Megatron computes in bf16 over fp32 master weights: the forward sees the rollout's rounding.
        self.compute_dtype = compute_dtype if compute_model is None else None
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # One CUDA device: the fused step needs no state-sized temporary (GLM-4.5 4-layer fits one H200 so);
        # FSDP2 and the CPU keep the foreach step the CPU thresholds were calibrated with.
        params = list(model.parameters())
        fused = all(p.device.type == "cuda" and not hasattr(p, "device_mesh") for p in params)
        self.optimizer = torch.optim.AdamW(
            params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None
        )

    def set_variant(self, inject, temperature: float) -> None:
        """`rlsmoke run --variants`: the next run's temperature and train-dropout (as built otherwise)."""
        self.temperature = temperature
        set_dropout(self.model, inject.value if inject.kind == "train-dropout" else None)

    @torch.no_grad()
    def forward_only(self, groups: list[Group]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The old log-probs and entropies, eval mode, no graph: what Miles' compute_log_prob does."""
        self.model.eval()
        with self.autocast():
            out = [token_logprobs(self.model, g, self.temperature) for g in groups]
        return [(logp.cpu(), entropy.cpu()) for logp, entropy in out]  # one wait, after the last forward

    def autocast(self):
        device = next(self.model.parameters()).device
        enabled = self.compute_dtype is not None and self.compute_dtype != torch.float32
        return torch.autocast(device.type, dtype=self.compute_dtype or torch.float32, enabled=enabled)

    def step(
        self, groups: list[Group], old: list[torch.Tensor], advantages: list[torch.Tensor]
    ) -> dict[str, float]:
        """One optimizer step over all groups (one micro-batch each), token-level loss."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        device = next(self.model.parameters()).device
        total_tokens = sum(g.mask.sum() for g in groups).clamp(min=1).item()
        step_sums = StepSums()
        for g, old_lp, adv in zip(groups, old, advantages, strict=True):
            mask = g.mask.to(device)  # (n, R)
            with self.autocast():
                logp, entropy = token_logprobs(self.model, g, self.temperature)  # (n, R) each
            loss, group_sums = group_loss(logp, entropy, mask, old_lp.to(device), adv.to(device), eps_clip=self.eps_clip,
                                          eps_clip_high=self.eps_clip_high, entropy_coef=self.entropy_coef)  # fmt: skip
            if self.kl_coef:
                with torch.no_grad():
                    ref_lp, _ = token_logprobs(self.ref_model, g, self.temperature)
                kl = grpo.k3(logp, ref_lp) * mask
                loss = loss + self.kl_coef * kl.sum()
                group_sums["kl_loss"] = kl.sum()
            step_sums.add(g, loss, group_sums)
            (loss / total_tokens).backward()
            precision.accumulate_grads(self._pairs)
        sums = step_sums.totals()
        params = [p for p in self.master.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip).item()  # the norm before clipping
        if not math.isfinite(grad_norm):
            grads = ((name, p.grad) for name, p in self.master.named_parameters() if p.grad is not None)
            bad = next(name for name, grad in grads if not grad.isfinite().all())
            message = f"grad_norm is {grad_norm}; first non-finite grad in {bad}"
            raise RunError(message, rule="train.finite_grads")
        before = checksums(self.master)
        self.optimizer.step()
        precision.refresh(self._pairs)
        if (changed := sum(1 for name, s in checksums(self.master).items() if s != before[name])) == 0:
            raise RunError("the optimizer step changed no parameter", rule="train.update_applied")
        self.model.eval()
        return step_metrics(sums, total_tokens, grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"],
                            changed=changed, count=len(before))  # fmt: skip


# A float64 copy of a whole expert tensor would be as large as the moments: 16 M elements (128 MiB) at a time.
CHECKSUM_CHUNK = 1 << 24


@torch.no_grad()
def checksums(model) -> dict[str, float]:
    # A float64 sum sees a 1e-6 update; under FSDP2 each rank sums its shard and one all-reduce adds them.
    names, sums, sharded = [], [], False
    for name, p in model.named_parameters():
        local = local_shard(p)
        sharded |= local is not p
        flat = local.detach().reshape(-1)
        total = torch.zeros((), dtype=torch.float64, device=flat.device)
        for i in range(0, flat.numel(), CHECKSUM_CHUNK):
            total += flat[i : i + CHECKSUM_CHUNK].double().sum()
        names.append(name)
        sums.append(total)
    stacked = torch.stack(sums) if sums else torch.zeros(0, dtype=torch.float64)
    if sharded:
        torch.distributed.all_reduce(stacked)
    return dict(zip(names, stacked.tolist(), strict=True))
