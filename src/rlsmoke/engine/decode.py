"""The rollout's static decode (`--rollout-decode static`): a KV cache allocated once and a decode step of
fixed shapes, captured as CUDA graphs on a GPU (`generate` pays a step in kernel launches: GLM-5 4-layer
decoded 2,400-3,400 tokens/s on an H200 where its floor is about 24,000). Sampling stays outside the
graph and is `generate`'s own; the cache length is rounded up to LENGTH_BUCKET so graphs are reused.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import transformers

CHECK_EVERY = 16
LENGTH_BUCKET = 128


def every_pool(indexer, packed_states):
    """A CUDA graph holds a decode step only if its shapes do not depend on the data (each model's step is
    traced in tests/unit/test_engine_rollout_decode.py). GLM-5.3-Flash's DSA indexer pools its keys
    `index_kpool` at a time from each row's first real slot, then drops the pools no row can see
    (`pool_valid.any(0)`): a count the data decide. This keeps every pool; what the indexer selects is
    unchanged, as a pool a row cannot see scores the minimum and its slots are masked to -1, and the
    attention's mask is the set of selected slots (pinned bit for bit against transformers' own)."""
    dim, size = indexer.head_dim, indexer.index_kpool
    keys, gates, valid = torch.split(packed_states, [dim, dim, 1], dim=-1)
    valid = valid.bool().squeeze(-1)
    rows, length = keys.shape[:2]
    first = torch.where(valid.any(-1), valid.long().argmax(-1), length)  # a row's first real slot
    span = torch.arange(-(-length // size) * size, device=keys.device).view(1, -1, size)
    slots = first[:, None, None] + span
    row = torch.arange(rows, device=keys.device)[:, None, None]
    inside = slots.clamp(0, length - 1)
    seen = valid[row, inside] & (slots < length)
    logits = gates[row, inside].float() + indexer.index_kpool_compress_ape.float()[None, None]
    weights = logits.masked_fill(~seen[..., None], float("-inf")).softmax(dim=2).nan_to_num()
    pooled = (weights.to(keys.dtype) * keys[row, inside]).sum(dim=2)
    return pooled, slots.masked_fill(~seen, -1), seen.all(-1)


def fix_shapes(model) -> None:
    """Bind `every_pool` to each DSA indexer of `model` that pools its keys (GLM-5.3-Flash's)."""
    for module in model.modules():
        if hasattr(module, "get_pooled_states") and hasattr(module, "index_kpool"):
            module.get_pooled_states = functools.partial(every_pool, module)


def unsupported(model) -> str | None:
    """Why `model` cannot decode over a static cache, for the summary; None when it can. (A step that can
    not be captured raises at the load's capture, which leaves the run on generate with its reason.)"""
    name, version = type(model).__name__, transformers.__version__
    params = inspect.signature(model.forward).parameters
    if not {"cache", "past_key_values"} & set(params) or "position_ids" not in params:
        return f"{name}.forward takes no KV cache and position ids (transformers {version})"
    try:
        transformers.StaticCache(config=model.config, max_cache_len=LENGTH_BUCKET)
    except (KeyError, ValueError, TypeError, AttributeError, NotImplementedError) as exc:
        return f"{name}'s layers have no static cache in transformers {version}: {type(exc).__name__} {exc}"
    return None


class StaticDecoder:
    """`model`'s sampling over a static cache; on CUDA the decode step is captured (`compiled`).
    `longest_prompt`: every call's cache is as long as that prompt's needs, so one graph serves the run."""

    def __init__(self, model, *, longest_prompt: int = 0):
        self.model = model
        self.longest_prompt = longest_prompt
        self.device = next(model.parameters()).device
        self.compiled = self.device.type == "cuda"
        params = inspect.signature(model.forward).parameters
        # transformers 5.17 says the latter
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.keep_one = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # one cache per (rows, length), reset between calls: a graph holds its buffers' addresses
        self.caches: dict[tuple[int, int], Any] = {}
        fix_shapes(model)
        self.step = self._forward
        if self.compiled:
            # its kernels are kept under $RLSMOKE_CACHE (rlsmoke.engine set the folders at its import)
            self.step = torch.compile(self._forward, mode="reduce-overhead", dynamic=False)

    def _forward(self, tokens, positions, mask, cache) -> torch.Tensor:
        out = self.model(tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                         **{self.cache_arg: cache}, **self.keep_one)  # fmt: skip
        return out.logits[:, -1].float()

    def capture(self, rows: int, max_new_tokens: int, pad_id: int) -> None:
        """Compiles and captures the decode step for calls of `rows` rows ahead of the first rollout, as
        SGLang captures its graphs when its server starts: a few steps over a one-token prompt."""
        tokens = torch.full((rows, 1), pad_id, dtype=torch.long, device=self.device)
        unchanged = lambda _ids, scores: scores  # noqa: E731
        # cudagraph trees record on the second call of a shape and replay from the third
        few_steps = dict(max_new_tokens=max_new_tokens, eos_id=pad_id, pad_id=pad_id, stop_after=4)
        self.sample(tokens, torch.ones_like(tokens), unchanged, **few_steps)

    def _cache(self, rows: int, length: int):
        key = (rows, length)
        if key not in self.caches:
            self.caches.clear()  # a rank's calls share one shape; another frees the last one's memory
            self.caches[key] = transformers.StaticCache(config=self.model.config, max_cache_len=length)
        else:
            self.caches[key].reset()
        return self.caches[key]

    @torch.no_grad()
    def sample(self, tokens: torch.Tensor, attention: torch.Tensor, processors, *, max_new_tokens: int,
               eos_id: int, pad_id: int, stop_after: int | None = None) -> torch.Tensor:  # fmt: skip
        """What greedy `generate` with `processors` returns for `tokens`, plus up to CHECK_EVERY - 1 pads."""
        rows, width = tokens.shape
        length = -(-(max(width, self.longest_prompt) + max_new_tokens) // LENGTH_BUCKET) * LENGTH_BUCKET
        cache = self._cache(rows, length)
        mask = torch.zeros(rows, length, dtype=attention.dtype, device=self.device)
        mask[:, :width] = attention
        # generate's positions: a left-padded row counts from its first real token
        positions = (attention.long().cumsum(-1) - 1).masked_fill_(attention == 0, 1)
        logits = self._forward(tokens, positions, mask[:, :width], cache)  # the prefill: eager, any width
        last = positions[:, -1:]
        response = torch.full((rows, max_new_tokens), pad_id, dtype=tokens.dtype, device=self.device)
        unfinished = torch.ones(rows, dtype=torch.bool, device=self.device)
        eos = torch.zeros(logits.shape[-1], dtype=torch.bool, device=self.device)
        eos[eos_id] = True
        steps = 0
        for t in range(min(max_new_tokens, stop_after or max_new_tokens)):
            if t:
                mask[:, width + t - 1] = 1
                if self.compiled:
                    torch.compiler.cudagraph_mark_step_begin()
                logits = self.step(response[:, t - 1 : t], last + t, mask, cache)
            scores = torch.where(eos, float("-inf"), logits) if t == 0 else logits
            scores = processors(response[:, max(t - 1, 0) : t], scores)  # the recorder reads the last token
            response[:, t] = torch.where(unfinished, scores.argmax(-1), pad_id)
            unfinished &= response[:, t] != eos_id
            steps = t + 1
            if steps % CHECK_EVERY == 0 and not bool(unfinished.any()):
                break
        return response[:, :steps]


def record(asked: str, decodes) -> dict:
    """summary.json's `rollout_decode`: asked for, used, and why a static decode did not run."""
    fallback = "; ".join(sorted({why for _, why in decodes if why})) or None
    return {"asked": asked, "ran": sorted({ran for ran, _ in decodes}), "fallback": fallback}
