"""A rendered argv against a recorded Miles flag table (`record_flags`): which flags its parser would refuse.

The table is what the real parser defines (flag, nargs, type, choices); the check is the part of
argparse that needs no code from Miles: every flag exists (the parser allows no abbreviations), takes
as many values as it declares, and each value is one of its choices and parses as its int or float.
Pure Python: it runs in CI without Miles, its Megatron or a network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.shipped import FIXTURES

TABLES = FIXTURES / "miles_flags"
_NUMBERS = {"int": int, "float": float}


@dataclass(frozen=True)
class FlagTable:
    target: str
    provenance: dict
    flags: dict[str, dict]

    @classmethod
    def load(cls, path: Path) -> FlagTable:
        data = json.loads(path.read_text())
        return cls(data["provenance"]["target"], data["provenance"], data["flags"])

    @classmethod
    def of(cls, target: str) -> FlagTable:
        return cls.load(TABLES / f"{target}.json")


def recorded_targets() -> list[str]:
    return sorted(p.stem for p in TABLES.glob("*.json"))


def _count_fits(nargs: int | str, n: int) -> bool:
    if isinstance(nargs, int):
        return n == nargs
    return {"?": n <= 1, "*": True, "+": n >= 1}.get(nargs, True)  # argparse.REMAINDER and the like: any


def refusals(args: list[str], table: FlagTable) -> list[str]:
    """One line per token the table's parser would refuse; `args` is the argv after the script."""
    out = []
    for i, tok in enumerate(args):
        if not tok.startswith("--"):
            continue
        flag = tok.split("=", 1)[0]
        spec = table.flags.get(flag)
        if spec is None:
            out.append(f"{flag}: not a flag of Miles {table.target} (unrecognized argument)")
            continue
        values = [tok.split("=", 1)[1]] if "=" in tok else []
        for nxt in args[i + 1 :]:
            if nxt.startswith("--"):
                break
            values.append(nxt)
        if not _count_fits(spec["nargs"], len(values)):
            out.append(
                f"{flag}: takes {spec['nargs']} value(s), given {len(values)}: {' '.join(values)}".rstrip(
                    ": "
                )
            )
            continue
        for value in values:
            if spec["choices"] is not None and value not in spec["choices"]:
                out.append(f"{flag}: invalid choice {value!r} (choose from {', '.join(spec['choices'])})")
            elif spec["type"] in _NUMBERS:
                try:
                    _NUMBERS[spec["type"]](value)
                except ValueError:
                    out.append(f"{flag}: {value!r} is not {spec['type']}")
    return out
