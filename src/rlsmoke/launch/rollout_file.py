"""Miles' debug-rollout file, written without Miles: what `--load-debug-rollout-data PATH` trains on.

Miles main (31f1ca961) writes it in `miles/ray/rollout/debug_data.py` (`save_debug_rollout_data`) as
`torch.save({"rollout_id": int, "metadata": dict, "samples": [Sample.to_dict(), ...]})` and reads it back
with `torch.load(weights_only=False)` and `Sample.from_dict`. A sample dict is the dataclass's `__dict__`
with `status` as its string and `spec_info` / `prefix_cache_info` as dicts (`miles/utils/types.py`).
`from_dict` needs `status`; `Sample.validate` needs `loss_mask` and `rollout_log_probs` of
`response_length` entries, the last `response_length` tokens being the response. Rewards are grouped for
GRPO by `group_index`; siblings of one `index` must share a reward, so every sample has its own index.

The format is pinned by `fixtures/miles_rollout/schema.json`, recorded from Miles' own `Sample` and
writer (`conformance.rollout_schema`); `schema_of` is how both sides are described. Needs torch only to save.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.shipped import FIXTURES

SCHEMA = FIXTURES / "miles_rollout" / "schema.json"
TEMPLATE_FIELD = "{rollout_id}"  # Miles formats the path with the rollout's id


@dataclass(frozen=True)
class RolloutSample:
    """One generated sample as the built-in engine has it: what Miles trains on."""

    group_index: int  # the prompt's group: GRPO normalises rewards within it
    index: int  # unique in the file
    prompt: str
    label: str
    prompt_tokens: tuple[int, ...]
    response_tokens: tuple[int, ...]
    response_text: str
    reward: float
    # log_softmax(logits / T) of each response token, T = --rollout-temperature
    rollout_log_probs: tuple[float, ...]
    truncated: bool  # the response hit the length cap without EOS


def sample_dict(s: RolloutSample) -> dict:
    """The sample as `Sample.to_dict()` gives it at Miles 31f1ca961: every field, the unused at its default."""
    n = len(s.response_tokens)
    return {
        "group_index": s.group_index, "index": s.index, "rollout_id": None, "prompt": s.prompt,
        "tokens": [int(t) for t in (*s.prompt_tokens, *s.response_tokens)],
        "multimodal_inputs": None, "multimodal_train_inputs": None,
        "response": s.response_text, "response_length": n, "label": s.label, "reward": float(s.reward),
        "loss_mask": [1] * n,  # the response up to and including EOS: what the engine trains on
        "weight_versions": [], "rollout_log_probs": [float(x) for x in s.rollout_log_probs],
        "rollout_routed_experts": None, "rollout_indexer_topk": None, "remove_sample": False,
        "teacher_log_probs": None, "opd_reverse_kl": None,
        "status": "truncated" if s.truncated else "completed",
        "metadata": {}, "generate_function_path": None, "train_metadata": None, "adapter": None,
        "reward_spec": None, "routing_key": None, "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": 0},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }  # fmt: skip


def path_for(template: str, rollout_id: int = 0) -> Path:
    """The file Miles opens for `rollout_id`: `template.format(rollout_id=...)`, as its loader formats it."""
    return Path(template.format(rollout_id=rollout_id))


def check_template(template: str) -> None:
    """A path Miles' `str.format` would break on (another brace) is refused before anything runs."""
    try:
        template.format(rollout_id=0)
    except (KeyError, IndexError, ValueError):
        raise RlsmokeError(f"rollout file {template} has braces Miles' loader would read as fields",
                           rule="miles.rollout_file", fix="use an --out path without { or }") from None  # fmt: skip


def write(path: Path, samples: list[RolloutSample], *, rollout_id: int = 0) -> Path:
    """The file, written whole (a temp file, then renamed): a reader never sees half of one."""
    import torch

    payload = {"rollout_id": rollout_id, "metadata": {}, "samples": [sample_dict(s) for s in samples]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=False)  # as Miles' loader does: the dicts hold plain Python values


# --- the schema: what a file's layout is, in plain JSON ---------------------------------------------------


def _type(value) -> str:
    """A value's type as the schema writes it: `list[int]` for a non-empty list, `dict{keys}` for a dict."""
    if isinstance(value, list) and value:
        return f"list[{'|'.join(sorted({type(v).__name__ for v in value}))}]"
    if isinstance(value, dict) and value:
        return "dict{" + ",".join(sorted(value)) + "}"
    return type(value).__name__


def schema_of(payload: dict) -> dict:
    """The layout of a loaded file: its keys and their types, and each sample field's type (one sample
    with a response, as every file holds)."""
    return {
        "file": {k: _type(payload[k]) if k != "samples" else "list" for k in payload},
        "sample": {k: _type(v) for k, v in payload["samples"][0].items()},
    }
