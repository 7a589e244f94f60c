"""Run records: one run's metrics and its summary.json. No torch, no eval.

A `Record` is one run's metrics, parsed from Miles' `step N: {...}` / `rollout N: {...}` log lines
or from the built-in engine's `metrics.jsonl`. The gates over it are `rlsmoke.thresholds`.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.artifacts import write_atomic
from rlsmoke.errors import RlsmokeError
from rlsmoke.runkey import FIELDS

KINDS = ("rollout", "step")

# --- records ----------------------------------------------------------------------------------

# Miles' log-probs checker compares the two engines' sample means of the same tokens. The mean is
# signed, so bf16 noise largely cancels in it while a systematic shift (a temperature applied on
# one side only) does not: it sees mismatches the mean abs diff cannot tell from noise.
MEAN_DIFF = "rollout/logprob_mean_diff"
MEAN_DIFF_OF = ("rollout/log_probs", "rollout/rollout_log_probs")  # train engine's, rollout engine's


def _derive(values: dict[str, float]) -> None:
    """Add the derived metrics a rollout entry's own metrics define (both engines' logs get them)."""
    train, rollout = MEAN_DIFF_OF
    if MEAN_DIFF not in values and train in values and rollout in values:
        values[MEAN_DIFF] = values[train] - values[rollout]


_LINE = re.compile(r"\b(step|rollout) (\d+): (\{.*\})\s*$")
_NAMED_FLOATS = {"nan": math.nan, "NaN": math.nan, "inf": math.inf, "Infinity": math.inf}
_NUMERIC_CALLS = {"float", "tensor", "np.float64", "np.float32", "numpy.float64", "np.int64", "int"}


def _literal(node: ast.AST):
    """A safe literal reader for logged dicts: numbers, strings, nan/inf and np.float64(x)-style calls."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _NAMED_FLOATS:
        return _NAMED_FLOATS[node.id]
    if isinstance(node, ast.Call) and ast.unparse(node.func) in _NUMERIC_CALLS and len(node.args) == 1:
        return float(_literal(node.args[0]))
    raise ValueError(f"not a literal: {ast.unparse(node)[:60]}")


def parse_log_line(line: str) -> tuple[str, int, dict[str, float]] | None:
    """`... step 3: {'train/ppo_kl': 0.0, ...}` -> ("step", 3, {...}); None for any other line."""
    m = _LINE.search(line)
    if not m:
        return None
    try:
        values = _literal(ast.parse(m.group(3), mode="eval").body)
    except (SyntaxError, ValueError):
        return None
    if not isinstance(values, dict):
        return None
    return m.group(1), int(m.group(2)), {str(k): float(v) for k, v in values.items() if _is_number(v)}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Record:
    """One run's metrics: {kind: {index: {key: value}}} plus what identifies the run."""

    entries: Mapping[str, Mapping[int, Mapping[str, float]]]
    source: str = ""
    artifacts: str = ""
    meta: Mapping[str, object] = field(default_factory=dict)  # case, platform, device, launcher, dtype, ...

    def series(self, metric: str) -> list[tuple[str, int, float]]:
        """Every (kind, index, value) of a metric, in kind then index order."""
        return [(kind, i, values[metric]) for kind in KINDS for i, values in sorted(self.entries.get(kind, {}).items())
                if metric in values]  # fmt: skip

    def value(self, metric: str, reduce: str = "max") -> float | None:
        series = [v for _, _, v in self.series(metric)]
        if not series:
            return None
        if reduce in ("max", "min", "absmax") and any(math.isnan(v) for v in series):
            return math.nan  # a NaN anywhere fails the gate; max() would hide it
        return {"max": max, "min": min, "first": lambda s: s[0], "last": lambda s: s[-1],
                "absmax": lambda s: max(s, key=abs)}[reduce](series)  # fmt: skip

    def keys(self) -> list[str]:
        return sorted({k for kind in self.entries.values() for values in kind.values() for k in values})

    @staticmethod
    def from_lines(lines: Iterable[dict], **kwargs) -> Record:
        lines = list(lines)
        seeds = {line.get("repeat") for line in lines}
        if len(seeds) > 1:  # merged by (kind, index), each seed would overwrite the one before
            raise RlsmokeError(f"metrics lines of {len(seeds)} seeds (`repeat` keys) make no one record",
                               rule="metrics.one_seed", fix="read a `--repeat` run one seed at a time: "
                               "group its lines by their `repeat` key (`rlsmoke calibrate` does)")  # fmt: skip
        entries: dict[str, dict[int, dict[str, float]]] = {k: {} for k in KINDS}
        for line in lines:
            if line.get("kind") not in KINDS:
                raise RlsmokeError(f"kind={line.get('kind')!r} in a metrics line is unknown", rule="metrics.kind",
                                   fix=f"use one of: {', '.join(KINDS)}")  # fmt: skip
            slot = entries[line["kind"]].setdefault(int(line["index"]), {})
            slot.update({k: float(v) for k, v in line["metrics"].items() if _is_number(v)})
        for values in entries["rollout"].values():
            _derive(values)
        return Record(entries, **kwargs)


def load_meta(folder: Path) -> dict:
    """What the run's summary.json says about the run (its key and seed); {} without one."""
    if not (folder / "summary.json").is_file():
        return {}
    summary = json.loads((folder / "summary.json").read_text())
    return {k: summary[k] for k in (*FIELDS, "seed") if k in summary}


def load_record(path: str | Path) -> Record:
    """A run's record from a run folder, its `metrics.jsonl`, or a Miles log (`step N: {...}` lines)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl" if (path / "metrics.jsonl").is_file() else path / "run.log"
    if not path.is_file():
        raise RlsmokeError(f"metrics={path} is missing", rule="metrics.exists",
                           fix="pass a run folder with metrics.jsonl, or a Miles log file")  # fmt: skip
    folder = path.parent
    meta = load_meta(folder)
    text = path.read_text(errors="replace")
    if path.suffix == ".jsonl":
        try:
            lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise RlsmokeError(
                f"metrics={path} line {exc.lineno} is not JSON", rule="metrics.jsonl"
            ) from None
        return Record.from_lines(lines, source=str(path), artifacts=str(folder), meta=meta)
    parsed = [p for p in map(parse_log_line, text.splitlines()) if p]
    if not parsed:
        raise RlsmokeError(f"log={path} has no `step N: {{...}}` or `rollout N: {{...}}` lines", rule="metrics.log",
                           fix="point at the Miles job log (ray job logs) or a run folder")  # fmt: skip
    lines = [{"kind": kind, "index": i, "metrics": m} for kind, i, m in parsed]
    return Record.from_lines(
        lines, source=str(path), artifacts=str(folder), meta=meta or {"launcher": "miles"}
    )


def seed_records(run: str | Path) -> list[Record]:
    """One record per seed: a `--repeat` run's lines carry a `repeat` key; a Miles run is one seed."""
    jsonl = Path(run) / "metrics.jsonl"
    if not jsonl.is_file():
        return [load_record(run)]
    by_seed: dict[int, list[dict]] = {}
    for line in jsonl.read_text().splitlines():
        if line.strip():
            line = json.loads(line)
            by_seed.setdefault(line.get("repeat", 0), []).append(line)
    meta = load_meta(Path(run))
    return [Record.from_lines(by_seed[k], source=str(jsonl), artifacts=str(run), meta=meta) for k in sorted(by_seed)]


def update_summary(folder: str | Path, fields: Mapping[str, object]) -> None:
    """Merge `fields` into the run's summary.json, atomically (a reader never sees half a file)."""
    path = Path(folder) / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    write_atomic(path, json.dumps(summary | dict(fields), indent=2, default=_json_default) + "\n")


def _json_default(x):
    return str(x)
