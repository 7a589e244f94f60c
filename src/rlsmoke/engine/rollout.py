"""Rollout: sampling with the model's KV cache (transformers `generate`), one group per prompt.

The engine reports its own log-prob of each sampled token under the sampling temperature (the
log-softmax of logits / T), as SGLang does; Miles' trainer divides by the same temperature. The n samples of a prompt share its length, so a group needs no padding, and the train
forward sees exactly the positions the rollout saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rlsmoke.engine.config import Inject


@dataclass
class Group:
    """One prompt's samples. Tensors live on the CPU so they travel between processes."""

    prompt_index: int
    prompt_len: int
    tokens: torch.Tensor  # (n, P+R) prompt then response
    mask: torch.Tensor  # (n, R) 1.0 up to and including the first EOS
    rollout_logprobs: torch.Tensor  # (n, R) float32
    rewards: torch.Tensor | None = None  # (n,)

    @property
    def response(self) -> torch.Tensor:
        return self.tokens[:, self.prompt_len :]  # (n, R)


class _Noise(LogitsProcessor):
    """--inject rollout-noise=SIGMA: Gaussian noise in the engine's logits (sampling and log-probs)."""

    def __init__(self, sigma: float, generator: torch.Generator):
        self.sigma, self.generator = sigma, generator

    def __call__(self, input_ids, scores):
        noise = torch.randn(scores.shape, generator=self.generator, device=scores.device, dtype=torch.float32)
        return scores + (self.sigma * noise).to(scores.dtype)


class LogprobRecorder(LogitsProcessor):
    """Keeps the log-softmax of each step and gathers it at the token sampled next.

    Runs before generate's temperature warper, so it sees the raw logits and divides them itself; only
    the distribution of the previous step is kept, never (R, V) of them.
    """

    def __init__(self, divide_by: float):
        self.divide_by = divide_by  # the temperature, or 1.0 under --inject temperature-mismatch
        self.prev: torch.Tensor | None = None  # (n, V)
        self.logprobs: list[torch.Tensor] = []  # R-1 of (n,) after generation, the last added by finish()

    def _take(self, token: torch.Tensor) -> None:
        self.logprobs.append(self.prev.gather(-1, token[:, None])[:, 0])

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self._take(input_ids[:, -1])
        self.prev = torch.log_softmax(scores.float() / self.divide_by, dim=-1)
        return scores

    def finish(self, last_token: torch.Tensor) -> torch.Tensor:
        self._take(last_token)
        return torch.stack(self.logprobs, dim=1)  # (n, R)


class RolloutEngine:
    def __init__(self, model, *, temperature: float, max_new_tokens: int, eos_id: int, pad_id: int,
                 inject: Inject | None = None):  # fmt: skip
        self.model = model
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.eos_id, self.pad_id, self.inject = eos_id, pad_id, inject or Inject()

    @torch.no_grad()
    def generate(self, prompt_ids: list[tuple[int, ...]], n: int, seed: int,
                 indices: list[int] | None = None) -> list[Group]:  # fmt: skip
        """n samples of each prompt (of `indices` only, when given: a data-parallel rank's share).

        A group's sampling seed depends on its prompt's index, not on which rank samples it.
        """
        chosen = range(len(prompt_ids)) if indices is None else indices
        return [self._group(i, prompt_ids[i], n, seed * 1000 + i) for i in chosen]

    def _group(self, index: int, ids: tuple[int, ...], n: int, seed: int) -> Group:
        device = self.model.device
        torch.manual_seed(seed)  # generate samples from the global generator
        prompt = torch.tensor([ids] * n, device=device)  # (n, P)
        processors = LogitsProcessorList()
        if self.inject.kind == "rollout-noise":
            g = torch.Generator(device=device).manual_seed(seed + 7)
            processors.append(_Noise(self.inject.value, g))
        # temperature-mismatch: the engine reports the raw logits' log-probs while the trainer applies
        # the temperature; one side forgetting T is the classic mismatch
        mismatch = self.inject.kind == "temperature-mismatch"
        recorder = LogprobRecorder(1.0 if mismatch else self.temperature)
        processors.append(recorder)
        out = self.model.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=self.temperature,
            top_k=0, top_p=1.0, max_new_tokens=self.max_new_tokens, min_new_tokens=1, logits_processor=processors,
            eos_token_id=self.eos_id, pad_token_id=self.pad_id, use_cache=True,
        )  # fmt: skip
        tokens = out  # (n, P+R'), R' <= max_new_tokens when every sample hit EOS early
        response = tokens[:, len(ids) :]  # (n, R')
        logprobs = recorder.finish(response[:, -1])  # (n, R')
        return Group(
            index, len(ids), tokens.cpu(), response_mask(response, self.eos_id).cpu(), logprobs.cpu()
        )


def response_mask(response: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1.0 for each token up to and including the first EOS, 0.0 after it."""
    is_eos = (response == eos_id).int()  # (n, R)
    after = (is_eos.cumsum(dim=1) - is_eos) > 0  # (n, R) strictly after the first EOS
    return (~after).float()
