"""Rewards: a small registry of verifiable scores, one float per sample in [0, 1]."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
TARGET_MODULUS = 4  # target set: token ids divisible by 4, about a quarter of any vocab


def _normalize(text: str) -> str:
    text = text.strip().replace(",", "").rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else str(value)


def math_reward(response: str, response_ids: Sequence[int], label: str) -> float:
    """Deepscaler-style: the last \\boxed{} answer, else the last number, equals the label."""
    boxed = _BOXED.findall(response)
    answer = boxed[-1] if boxed else (_NUMBER.findall(response) or [""])[-1]
    return float(bool(answer) and _normalize(answer) == _normalize(label))


def target_reward(response: str, response_ids: Sequence[int], label: str) -> float:
    """The share of response tokens in a fixed target set: dense, so an untrained group has variance."""
    return sum(t % TARGET_MODULUS == 0 for t in response_ids) / max(len(response_ids), 1)


REWARDS: dict[str, Callable[[str, Sequence[int], str], float]] = {
    "deepscaler": math_reward,  # Miles' name (rlsmoke.facts.REWARDS)
    "target": target_reward,
}
