"""The prompt set: JSONL of {prompt, label}, read through the tokenizer's chat template."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.errors import RlsmokeError


@dataclass(frozen=True)
class Prompt:
    text: str
    label: str
    ids: tuple[int, ...] = ()


def read_prompts(path: Path, n: int, seed: int) -> list[Prompt]:
    """`n` prompts after a seeded shuffle (Miles' --rollout-shuffle), without tokenizing."""
    path = Path(path)
    if not path.is_file():
        raise RlsmokeError(
            f"prompt_data={path} is missing", rule="data.exists", fix="pass --prompt-data FILE.jsonl"
        )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bad = [i for i, r in enumerate(rows) if not {"prompt", "label"} <= set(r)]
    if bad or len(rows) < n:
        raise RlsmokeError(
            f"prompt_data={path} has {len(rows)} rows (need {n}, each with prompt and label; bad: {bad[:3]})",
            rule="data.rows",
            fix="fix the file or lower --n-prompts",
        )
    random.Random(seed).shuffle(rows)
    return [Prompt(r["prompt"], str(r["label"])) for r in rows[:n]]


def encode(tokenizer, prompt: Prompt) -> Prompt:
    """The prompt as the chat template renders one user turn plus the assistant header."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True,
                                        tokenize=True)  # fmt: skip
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return Prompt(prompt.text, prompt.label, tuple(int(i) for i in ids))
