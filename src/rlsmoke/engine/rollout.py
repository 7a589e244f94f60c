"""Rollout: sampling with the model's KV cache, one group per prompt (transformers `generate` or
`engine.decode`). The engine reports each sampled token's log-prob under the sampling temperature, as
SGLang does. Each group draws from a generator seeded by its prompt's index, so its samples do not
depend on the batch."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from rlsmoke.engine import decode as decode_mod
from rlsmoke.engine import kda
from rlsmoke.engine.config import Inject, RunConfig
from rlsmoke.errors import RunError


@dataclass
class Group:
    """One prompt's samples. Tensors live on the CPU so they travel between processes."""

    prompt_index: int
    prompt_len: int
    tokens: torch.Tensor  # (n, P+R) prompt then response
    mask: torch.Tensor  # (n, R) 1.0 up to and including the first EOS
    rollout_logprobs: torch.Tensor  # (n, R) float32
    rewards: torch.Tensor | None = None  # (n,)
    decode: str = "generate"  # what sampled it: "generate" or "static" (engine.decode)
    fallback: str | None = None  # why a static decode asked for was not the one that ran

    @property
    def response(self) -> torch.Tensor:
        return self.tokens[:, self.prompt_len :]  # (n, R)


class _Noise(LogitsProcessor):
    """--inject rollout-noise=SIGMA: Gaussian noise in the engine's logits, from each group's generator."""

    def __init__(self, sigma: float, rows: list[slice], generators: list[torch.Generator]):
        self.sigma, self.rows, self.generators = sigma, rows, generators

    def __call__(self, input_ids, scores):
        noise = torch.empty(scores.shape, device=scores.device, dtype=torch.float32)
        for rows, g in zip(self.rows, self.generators, strict=True):
            noise[rows] = torch.randn(noise[rows].shape, generator=g, device=noise.device, dtype=noise.dtype)
        return scores + (self.sigma * noise).to(scores.dtype)


class GroupSampler(LogitsProcessor):
    """Samples each group's tokens from its own generator and leaves only those for generate's greedy pick.

    What `torch.multinomial(probs[rows], 1, generator=g)` draws, bit for bit (torch draws one sample as
    argmax(p / q), q ~ Exp(1) from g), with one argmax over all groups and without its two reads of
    the probabilities' validity on the host, which stalled each decode step once a group; non-finite
    log-probs are the rollout's own rule (`rollout.finite_logprobs`)."""

    def __init__(self, temperature: float, rows: list[slice], generators: list[torch.Generator]):
        self.temperature, self.rows, self.generators = temperature, rows, generators

    def __call__(self, input_ids, scores):
        probs = torch.softmax(scores / self.temperature, dim=-1)
        q = torch.empty_like(probs)
        for rows, g in zip(self.rows, self.generators, strict=True):
            q[rows].exponential_(1, generator=g)
        chosen = probs.div_(q).argmax(-1)
        return torch.full_like(scores, float("-inf")).scatter_(1, chosen[:, None], 0.0)


class LogprobRecorder(LogitsProcessor):
    """Keeps the log-softmax of each step (of the raw logits / T) and gathers it at the token sampled next."""

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


# Left padding cannot pass the reference KDA path's short convolution and recurrent state.
NO_LEFT_PADDING = ("glm5.3-flash",)


def batch_for(choice: str, device: str, family: str, kda: str = "") -> str:
    """One call per rank on a GPU (cost is launches, not rows); per group on CPU, as calibrated."""
    if choice == "auto":
        choice = "rank" if device.startswith("cuda") else "group"
    return "length" if choice == "rank" and family in NO_LEFT_PADDING and kda != "fla" else choice


class RolloutEngine:
    def __init__(self, model, *, temperature: float, max_new_tokens: int, eos_id: int, pad_id: int,
                 inject: Inject | None = None, batch: str = "group", decode: str = "generate",
                 longest_prompt: int = 0):  # fmt: skip
        self.model = model
        self.temperature, self.max_new_tokens = temperature, max_new_tokens
        self.eos_id, self.pad_id, self.inject = eos_id, pad_id, inject or Inject()
        self.batch = batch
        if batch != "group":
            keep_grouped_experts(model)
        self.fallback = decode_mod.unsupported(model) if decode == "static" else None
        static = decode == "static" and self.fallback is None
        self.static = decode_mod.StaticDecoder(model, longest_prompt=longest_prompt) if static else None

    def capture(self, n_prompts: int, n_samples: int) -> None:
        """The static decode's compile and capture, for calls over `n_prompts` prompts, before the first
        rollout; a step that cannot be captured leaves the run on `generate`, with the reason."""
        if self.static is None or not self.static.compiled or self.batch == "length":  # length: rows vary
            return
        rows = n_samples * (n_prompts if self.batch == "rank" else 1)
        try:
            self.static.capture(rows, self.max_new_tokens, self.pad_id)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - as in a call: generate from here on, and why
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        self.static, self.fallback = None, f"{type(exc).__name__}: {first}"

    def set_variant(self, inject: Inject, temperature: float) -> None:
        """`rlsmoke run --variants`: the next run's fault and sampling temperature."""
        self.inject, self.temperature = inject, temperature

    @torch.no_grad()
    def generate(self, prompt_ids: list[tuple[int, ...]], n: int, seed: int,
                 indices: list[int] | None = None) -> list[Group]:  # fmt: skip
        """n samples of each prompt (of `indices` only: a data-parallel rank's share)."""
        chosen = list(range(len(prompt_ids)) if indices is None else indices)
        if self.batch == "group":
            calls = [[i] for i in chosen]
        elif self.batch == "length":
            lengths = sorted({len(prompt_ids[i]) for i in chosen})
            calls = [[i for i in chosen if len(prompt_ids[i]) == n_tok] for n_tok in lengths]
        else:
            calls = [chosen]
        groups = [g for call in calls for g in self._call([(i, prompt_ids[i]) for i in call], n, seed)]
        return sorted(groups, key=lambda g: g.prompt_index)  # the caller pairs them with its prompts

    def _call(self, prompts: list[tuple[int, tuple[int, ...]]], n: int, seed: int) -> list[Group]:
        """One generate call over the n samples of each prompt, left-padded to the longest prompt."""
        device = self.model.device
        width = max(len(ids) for _, ids in prompts)
        rows = [slice(k * n, (k + 1) * n) for k in range(len(prompts))]
        tokens = torch.tensor([[self.pad_id] * (width - len(ids)) + list(ids) for _, ids in prompts for _ in range(n)],
                              device=device)  # fmt: skip
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids in prompts for _ in range(n)],
                                 device=device)  # fmt: skip

        def generators(offset: int) -> list[torch.Generator]:
            return [torch.Generator(device=device).manual_seed(seed * 1000 + i + offset) for i, _ in prompts]

        def processors() -> tuple[LogitsProcessorList, LogprobRecorder]:
            # fresh generators each time: a call the static decode gave up on draws the same numbers again
            chain = LogitsProcessorList()
            if self.inject.kind == "rollout-noise":
                chain.append(_Noise(self.inject.value, rows, generators(7)))
            # temperature-mismatch: the engine reports the raw logits' log-probs
            divide_by = 1.0 if self.inject.kind == "temperature-mismatch" else self.temperature
            recorder = LogprobRecorder(divide_by)
            chain.extend([recorder, GroupSampler(self.temperature, rows, generators(0))])
            return chain, recorder

        response = None
        if self.static is not None:
            chain, recorder = processors()
            try:
                response = self.static.sample(tokens, attention, chain, max_new_tokens=self.max_new_tokens,
                                              eos_id=self.eos_id, pad_id=self.pad_id)  # fmt: skip
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:  # a model the compiler cannot capture: generate from here on, and why
                self._give_up(exc)
        if response is None:
            chain, recorder = processors()
            out = self.model.generate(
                tokens, attention_mask=attention, do_sample=False, max_new_tokens=self.max_new_tokens,
                min_new_tokens=1, logits_processor=chain, eos_token_id=self.eos_id, pad_token_id=self.pad_id,
                use_cache=True,
            )  # fmt: skip
            response = out[:, width:]  # (N, R'), R' <= max_new_tokens when every sample hit EOS early
        logprobs = recorder.finish(response[:, -1])  # (N, R')
        mask = response_mask(response, self.eos_id)
        if bool((broken := (mask > 0) & ~torch.isfinite(logprobs)).any()):
            index = prompts[int(broken.any(1).nonzero()[0, 0]) // n][0]  # n rows a prompt, in order
            message = f"a sampled token's rollout log-prob is not finite on group {index}"
            raise RunError(message, rule="rollout.finite_logprobs")
        groups = []
        for (index, ids), r in zip(prompts, rows, strict=True):
            # a group ends where its own longest sample ends, as a call for it alone would (the static decode
            # looks for the end only now and then: its columns past the last EOS go here too)
            length = int(mask[r].sum(1).max().item())
            groups.append(Group(index, len(ids), torch.cat([tokens[r, width - len(ids) :], response[r, :length]], 1).cpu(),
                                mask[r, :length].cpu(), logprobs[r, :length].cpu(),
                                decode="static" if self.static is not None else "generate",
                                fallback=self.fallback))  # fmt: skip
        return groups


def rollout_engine(model, cfg: RunConfig, device: str, eos_id: int, pad_id: int) -> RolloutEngine:
    batch = batch_for(cfg.rollout_batch, device, cfg.spec.family, kda.choose(device, cfg.spec.family))
    # auto is `rlsmoke.resolve`'s to decide; a config made without it keeps transformers' own
    decode = "generate" if cfg.rollout_decode == "auto" else cfg.rollout_decode
    # the prompt file's longest prompt sizes every call's cache: one captured shape for all seeds
    return RolloutEngine(model, temperature=cfg.rollout_temperature, max_new_tokens=cfg.max_response_len,
                         eos_id=eos_id, pad_id=pad_id, inject=cfg.inject, batch=batch, decode=decode,
                         longest_prompt=cfg.longest_prompt)  # fmt: skip


def keep_grouped_experts(model) -> None:
    """grouped_mm reads each expert once; GPU generate's batched_mm gathers one per (token, expert) pair."""
    if hasattr(model, "_optimize_model_for_decode"):
        model._optimize_model_for_decode = contextlib.nullcontext


def response_mask(response: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1.0 for each token up to and including the first EOS, 0.0 after it."""
    is_eos = (response == eos_id).int()  # (n, R)
    return (is_eos.cumsum(dim=1) - is_eos == 0).float()  # no EOS strictly before it
