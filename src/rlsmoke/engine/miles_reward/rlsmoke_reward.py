"""The built-in engine's dense `target` reward as a Miles reward function: `--custom-rm-path rlsmoke_reward.target`.

Needs no rlsmoke installed where the job runs: it reads `rlsmoke/engine/reward.py` beside it by path.
Miles calls `await target(args, sample)` per sample, or with a group's list (`--group-rm`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_rlsmoke_engine_reward", Path(__file__).resolve().parents[1] / "reward.py"
)
_reward = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_reward)


def score(sample) -> float:
    n = int(sample.response_length or 0)
    ids = list(sample.tokens[-n:]) if n > 0 else []  # the sampled tokens: `tokens` is prompt, then response
    return _reward.target_reward(sample.response or "", ids, sample.label or "")


async def target(args, sample, **kwargs):
    return [score(s) for s in sample] if isinstance(sample, list) else score(sample)
