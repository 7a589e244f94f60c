"""The prompt set: JSONL of {prompt, label}, read through the tokenizer's chat template."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.paths import check_file


@dataclass(frozen=True)
class Prompt:
    text: str
    label: str
    ids: tuple[int, ...] = ()


def prompt_rows(path: Path, n: int) -> list[dict]:
    """At least `n` rows of a prompt file, each checked; no torch (`rlsmoke run` calls it first)."""
    path = Path(path)
    try:
        check_file(path, "prompt_data", fix="pass --prompt-data FILE.jsonl")
    except RlsmokeError as exc:
        if exc.rule == "path.missing":  # the rule a missing prompt file has always had
            exc.rule = "data.exists"
        raise
    fix = 'one JSON object per line: {"prompt": "...", "label": "..."}'
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RlsmokeError(f"prompt_data={path} cannot be read as UTF-8 text ({exc})", rule="data.jsonl",
                           fix=fix) from None  # fmt: skip
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"prompt_data={path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RlsmokeError(f"{where} is not JSON ({exc.msg}): the file must be JSONL", rule="data.jsonl",
                               fix=fix) from None  # fmt: skip
        if not isinstance(row, dict):
            raise RlsmokeError(f"{where} is not an object", rule="data.rows", fix=fix)
        if missing := [k for k in ("prompt", "label") if k not in row]:
            raise RlsmokeError(f"{where} has no {', '.join(missing)}", rule="data.rows", fix=fix)
        if not isinstance(row["prompt"], str):
            raise RlsmokeError(f"{where}'s prompt is not a string", rule="data.rows", fix=fix)
        rows.append(row)
    if len(rows) < n:
        raise RlsmokeError(f"prompt_data={path} has {len(rows)} rows, the run needs {n}", rule="data.rows",
                           fix="add rows or lower --n-prompts")  # fmt: skip
    return rows


def read_prompts(path: Path, n: int, seed: int) -> list[Prompt]:
    """`n` prompts after a seeded shuffle (Miles' --rollout-shuffle), without tokenizing."""
    rows = prompt_rows(path, n)
    random.Random(seed).shuffle(rows)
    return [Prompt(r["prompt"], str(r["label"])) for r in rows[:n]]


def encode(tokenizer, prompt: Prompt) -> Prompt:
    """The prompt as the chat template renders one user turn plus the assistant header."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True,
                                        tokenize=True)  # fmt: skip
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return Prompt(prompt.text, prompt.label, tuple(int(i) for i in ids))
