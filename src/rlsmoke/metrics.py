"""Run records: one run's metrics (Miles' log lines or the engine's metrics.jsonl) and its summary.json."""

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

# The signed mean diff lets bf16 noise cancel while a systematic shift (one-sided temperature) does not.
MEAN_DIFF = "rollout/logprob_mean_diff"
MEAN_DIFF_OF = ("rollout/log_probs", "rollout/rollout_log_probs")  # train engine's, rollout engine's


# Miles' lines may carry logging's and Ray's prefixes and Ray's `[repeated Nx across cluster]` tail; a
# critic's lines are not the actor's.
_LINE = re.compile(r"(?<![-\w])(step|rollout) (\d+): (\{.*\})(?:\s*\[repeated \d+x across cluster\])?\s*$")
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
    if not (m := _LINE.search(line)):
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
        if not (series := [v for _, _, v in self.series(metric)]):
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
        train, rollout = MEAN_DIFF_OF  # derived for both engines' logs
        for values in entries["rollout"].values():
            if MEAN_DIFF not in values and train in values and rollout in values:
                values[MEAN_DIFF] = values[train] - values[rollout]
        return Record(entries, **kwargs)


def load_meta(folder: Path) -> dict:
    """What the run's summary.json says about the run (its key and seed); {} without one."""
    if not (folder / "summary.json").is_file():
        return {}
    summary = json.loads((folder / "summary.json").read_text())
    return {k: summary[k] for k in (*FIELDS, "seed") if k in summary}


def load_record(path: str | Path, *, require_ci_history: bool = False) -> Record:
    """A run's record from a run folder, its `metrics.jsonl`, or a Miles log (`step N: {...}` lines). A Miles
    log is checked against the CI history beside it: where there is one, or always with `require_ci_history`."""
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
    if not (parsed := [p for p in map(parse_log_line, text.splitlines()) if p]):
        raise RlsmokeError(f"log={path} has no `step N: {{...}}` or `rollout N: {{...}}` lines", rule="metrics.log",
                           fix="point at the Miles job log (ray job logs) or a run folder")  # fmt: skip
    lines = [{"kind": kind, "index": i, "metrics": m} for kind, i, m in _fold_repeats(parsed, path)]
    meta = meta or {"launcher": "miles"}
    record = Record.from_lines(lines, source=str(path), artifacts=str(folder), meta=meta)
    history = folder / CI_HISTORY
    return _with_ci_history(record, history) if history.is_dir() or require_ci_history else record


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _fold_repeats(parsed: list[tuple[str, int, dict]], path: Path) -> list[tuple[str, int, dict]]:
    """Miles logs each train step twice: an identical repeat folds, a differing one is an error."""
    seen: dict[tuple[str, int], dict] = {}
    for kind, i, values in parsed:
        first = seen.setdefault((kind, i), values)
        diff = sorted(k for k in first.keys() | values.keys() if k not in first or k not in values
                      or not _close(first[k], values[k]))  # fmt: skip
        if diff:
            shown = ", ".join(f"{k}: {first.get(k)} then {values.get(k)}" for k in diff[:3])
            raise RlsmokeError(f"log={path} has `{kind} {i}` twice with different values ({shown})",
                               rule="metrics.log_repeat", fix="one run per log: was it appended to, or do two "
                               "actors log as the same role? see the lines in the log")  # fmt: skip
    return [(kind, i, values) for (kind, i), values in seen.items()]


# --- Miles' CI metrics: CiHistoryBackend's JSONL ---------------------------------------------------

CI_HISTORY = "ci_history"  # the run's MILES_CI_GATE_RECORD_DIR, under its artifacts (launch.flow)
CI_HISTORY_METRICS = ("train/grad_norm", "train/ppo_kl", "train/train_rollout_logprob_abs_diff",
                      "train/train_rollout_kl", "rollout/raw_reward")  # fmt: skip


def read_ci_history(folder: Path) -> dict[str, dict[int, float]]:
    """Every `<pid>-<uuid>.jsonl` of the folder merged: {metric: {step: value}}."""
    merged: dict[str, dict[int, float]] = {}
    for file in sorted(folder.glob("*.jsonl")):
        for n, line in enumerate(file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                # float() reads the strings strict JSON writes for non-finite values: NaN, Infinity, -Infinity
                points = [(int(step), float(v)) for step, v in item["series"]]
                metric = str(item["metric"])
            except (ValueError, KeyError, TypeError) as exc:
                raise RlsmokeError(f"ci_history={file} line {n} is not a CI history record ({exc})",
                                   rule="metrics.ci_history", fix="see the run's job log for how Miles wrote it") from None  # fmt: skip
            series = merged.setdefault(metric, {})
            for step, value in points:
                if step in series and not _close(series[step], value):  # two processes, two values
                    raise RlsmokeError(f"{metric} at step {step} is {series[step]} and {value} in ci_history={folder}",
                                       rule="metrics.ci_history_disagrees", fix="one run per record dir: was "
                                       "the folder reused, or did two processes log this metric?")  # fmt: skip
                series[step] = value
    return merged


def _with_ci_history(record: Record, folder: Path) -> Record:
    """The record checked against Miles' own JSONL; a metric only the JSONL has joins the record."""
    history = read_ci_history(folder)
    entries = {kind: {i: dict(v) for i, v in by_index.items()} for kind, by_index in record.entries.items()}
    for metric in CI_HISTORY_METRICS:
        kind = "rollout" if metric.startswith("rollout/") else "step"
        logged = {i: v[metric] for i, v in entries[kind].items() if metric in v}
        if metric not in history:
            if logged:
                raise RlsmokeError(f"ci_history={folder} has no {metric}, which the log has at {kind} "
                                   f"{', '.join(map(str, sorted(logged)))}", rule="metrics.ci_history_missing",
                                   fix="Miles' CiHistoryBackend records it: is the job's Miles older than the "
                                   "target, or did a process die before its first log?")  # fmt: skip
            continue
        recorded = history[metric]
        if not logged:  # only the JSONL has it
            for i, v in recorded.items():
                entries[kind].setdefault(i, {})[metric] = v
            continue
        for i in sorted(logged.keys() | recorded.keys()):
            if i in logged and i in recorded and _close(logged[i], recorded[i]):
                continue
            raise RlsmokeError(f"{metric} at {kind} {i} is {logged.get(i, 'absent')} in the log and "
                               f"{recorded.get(i, 'absent')} in ci_history={folder}",
                               rule="metrics.ci_history_disagrees",
                               fix="the two are one value Miles logged twice: compare the job log with the "
                               "JSONL; a log of another run in the same folder is the usual cause")  # fmt: skip
    return Record(entries, record.source, record.artifacts, record.meta)


def seed_records(run: str | Path) -> list[Record]:
    """One record per seed: a `--repeat` run's lines carry a `repeat` key; a Miles run is one seed."""
    if not (jsonl := Path(run) / "metrics.jsonl").is_file():
        return [load_record(run)]
    by_seed: dict[int, list[dict]] = {}
    for line in map(json.loads, filter(str.strip, jsonl.read_text().splitlines())):
        by_seed.setdefault(line.get("repeat", 0), []).append(line)
    meta = load_meta(Path(run))
    return [
        Record.from_lines(by_seed[k], source=str(jsonl), artifacts=str(run), meta=meta)
        for k in sorted(by_seed)
    ]


def update_summary(folder: str | Path, fields: Mapping[str, object]) -> None:
    """Merge `fields` into the run's summary.json, atomically (a reader never sees half a file)."""
    path = Path(folder) / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    write_atomic(path, json.dumps(summary | dict(fields), indent=2, default=str) + "\n")
