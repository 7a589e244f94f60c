"""Run metrics and their gates. No torch, no eval.

A `Record` is one run's metrics, parsed from Miles' `step N: {...}` / `rollout N: {...}` log lines
or from the built-in engine's `metrics.jsonl`. `Gates` are data, read from `fixtures/thresholds/`
and keyed by (case, platform, device class, launcher, dtype, width); `Gates.check(record)` returns a
`Verdict` that lists every failure with its value, bound, margin, provenance and the artifacts.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.runkey import FIELDS as KEY_FIELDS
from rlsmoke.runkey import RunKey
from rlsmoke.shipped import FIXTURES

THRESHOLDS_DIR = FIXTURES / "thresholds"
SCHEMA_VERSION = 1
KINDS = ("rollout", "step")
OPS = ("<", "<=", ">", ">=", "abs<", "finite>")
REDUCES = ("max", "min", "first", "last", "absmax")

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


def load_record(path: str | Path) -> Record:
    """A run's record from a run folder, its `metrics.jsonl`, or a Miles log (`step N: {...}` lines)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl" if (path / "metrics.jsonl").is_file() else path / "run.log"
    if not path.is_file():
        raise RlsmokeError(f"metrics={path} is missing", rule="metrics.exists",
                           fix="pass a run folder with metrics.jsonl, or a Miles log file")  # fmt: skip
    folder = path.parent
    meta = {}
    if (folder / "summary.json").is_file():
        summary = json.loads((folder / "summary.json").read_text())
        meta = {
            k: summary[k]
            for k in ("case", "platform", "device", "launcher", "dtype", "seed", "width")
            if k in summary
        }
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
    return [Record.from_lines(by_seed[k]) for k in sorted(by_seed)]


def update_summary(folder: str | Path, fields: Mapping[str, object]) -> None:
    """Merge `fields` into the run's summary.json, atomically (a reader never sees half a file)."""
    path = Path(folder) / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summary | dict(fields), indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(x):
    return str(x)


# --- gates ------------------------------------------------------------------------------------


def summary_key(metric: str, reduce: str = "max") -> str:
    """The flat key of a gated value: the metric, suffixed when not the default max."""
    return metric if reduce == "max" else f"{metric}@{reduce}"


@dataclass(frozen=True)
class Gate:
    name: str
    metric: str
    op: str  # one of OPS
    bound: float
    reduce: str = "max"  # how the metric's series becomes one value
    provenance: str = ""

    def __post_init__(self):
        if self.op not in OPS or self.reduce not in REDUCES:
            raise RlsmokeError(f"gate {self.name}: op={self.op!r} reduce={self.reduce!r} is unknown",
                               rule="gate.schema", fix=f"op in {OPS}, reduce in {REDUCES}")  # fmt: skip

    @property
    def summary_key(self) -> str:
        return summary_key(self.metric, self.reduce)

    def evaluate(self, value: float | None) -> GateResult:
        if value is None:
            return GateResult(self, None, False, math.nan, "missing: the run did not log this metric")
        b, v = self.bound, value
        margins = {"<": b - v, "<=": b - v, ">": v - b, ">=": v - b, "abs<": b - abs(v), "finite>": v - b}
        passed = {"<": v < b, "<=": v <= b, ">": v > b, ">=": v >= b, "abs<": abs(v) < b,
                  "finite>": math.isfinite(v) and v > b}[self.op]  # fmt: skip
        margin = margins[self.op]
        return GateResult(
            self, value, bool(passed) and not math.isnan(v), margin if math.isfinite(margin) else math.nan
        )


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    value: float | None
    passed: bool
    margin: float  # >= 0 when there is room: bound - value for an upper bound, value - bound for a lower one
    note: str = ""

    def to_json(self) -> dict:
        g = self.gate
        return {"name": g.name, "metric": g.metric, "reduce": g.reduce, "value": _jsonable(self.value),
                "bound": g.bound, "op": g.op, "passed": self.passed, "margin": _jsonable(self.margin),
                "provenance": g.provenance}  # fmt: skip

    def line(self) -> str:
        shown = "missing" if self.value is None else f"{self.value:.4g}"
        op = {"abs<": "|x| <", "finite>": "finite and >"}.get(self.gate.op, self.gate.op)
        return f"{self.gate.name}: {self.gate.summary_key} = {shown}, bound {op} {self.gate.bound:.4g}, margin {self.margin:.3g}"


def _jsonable(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


@dataclass(frozen=True)
class Verdict:
    results: tuple[GateResult, ...]
    artifacts: str = ""
    key: RunKey | None = None
    source: str = ""  # the thresholds file the gates came from

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]

    def values(self) -> dict[str, float | None]:
        return {r.gate.summary_key: _jsonable(r.value) for r in self.results}

    def summary_fields(self) -> dict[str, object]:
        """What a gated run's summary.json says about its gates (`update_summary`)."""
        return {"metrics": self.values(), "gates": [r.to_json() for r in self.results], "thresholds": self.source,
                "verdict": "PASS" if self.passed else "FAIL"}  # fmt: skip

    def table(self) -> str:
        rows = [("gate", "metric", "value", "bound", "margin", "")]
        for r in self.results:
            op = {"abs<": "|x|<", "finite>": "fin>"}.get(r.gate.op, r.gate.op)
            rows.append((r.gate.name, r.gate.summary_key, "missing" if r.value is None else f"{r.value:.4g}",
                         f"{op} {r.gate.bound:.4g}", f"{r.margin:.3g}", "PASS" if r.passed else "FAIL"))  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        return "\n".join(lines + [f"verdict: {'PASS' if self.passed else 'FAIL'}"])

    def report(self) -> str:
        """Every failure with value, bound, margin and provenance, then where the artifacts are."""
        if self.passed:
            return (
                f"all {len(self.results)} gates passed ({_key_text(self.key)}); artifacts: {self.artifacts}"
            )
        lines = [f"{len(self.failures)} of {len(self.results)} gates failed ({_key_text(self.key)}):"]
        for r in self.failures:
            lines.append(f"  - {r.line()}{' (' + r.note + ')' if r.note else ''}")
            lines.append(f"    provenance: {r.gate.provenance}")
        lines.append(f"artifacts: {self.artifacts}")
        lines.append("next: open run.log and metrics.jsonl there; if the bound itself is stale, recalibrate: "
                     "`rlsmoke run CASE --repeat 10`, then `rlsmoke calibrate DIR --write FILE`")  # fmt: skip
        return "\n".join(lines)


def _key_text(key: RunKey | None) -> str:
    return key.text() if key else "no key"


@dataclass(frozen=True)
class Gates:
    gates: tuple[Gate, ...]
    key: RunKey | None = None
    source: str = ""

    def check(self, record: Record) -> Verdict:
        results = tuple(g.evaluate(record.value(g.metric, g.reduce)) for g in self.gates)
        return Verdict(results, record.artifacts, self.key, self.source)

    def __iter__(self):
        return iter(self.gates)


# --- thresholds files -------------------------------------------------------------------------


def read_entries(directory: Path) -> list[tuple[Path, dict]]:
    entries = []
    for path in sorted(Path(directory).glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("schema_version") != SCHEMA_VERSION or "entries" not in doc:
            raise RlsmokeError(
                f"thresholds={path} has schema_version={doc.get('schema_version')!r}",
                rule="thresholds.schema",
                fix=f"write schema_version {SCHEMA_VERSION} with an entries list",
            )
        for entry in doc["entries"]:
            unknown = set(entry) - {"key", "gates", "provenance", "note"}
            unknown |= set(entry.get("key", {})) - set(KEY_FIELDS)
            if unknown:
                raise RlsmokeError(
                    f"thresholds={path} has unknown fields {sorted(unknown)}",
                    rule="thresholds.schema",
                    fix=f"entry fields: key, gates, provenance, note; key fields: {', '.join(KEY_FIELDS)}",
                )
            entries.append((path, entry))
    return entries


def _gate(spec: dict, entry_provenance: dict) -> Gate:
    unknown = set(spec) - {"name", "metric", "op", "bound", "reduce", "max_observed", "provenance"}
    if unknown:
        raise RlsmokeError(
            f"gate {spec.get('name')!r} has unknown fields {sorted(unknown)}", rule="thresholds.schema"
        )
    own = spec.get("provenance")
    if own is None:
        p = entry_provenance
        own = (f"{p.get('status', '?')}: {p.get('runs', '?')} runs on {p.get('device', '?')}, {p.get('date', '?')}, "
               f"{p.get('versions', '?')}; max observed {spec.get('max_observed', '?')}; {p.get('margin_rule', '')}")  # fmt: skip
    return Gate(
        spec["name"],
        spec["metric"],
        spec["op"],
        float(spec["bound"]),
        spec.get("reduce", "max"),
        own.strip("; "),
    )


def thresholds_dirs() -> list[Path]:
    """Where entries are read: `RLSMOKE_THRESHOLDS_DIR` (a cluster's own calibrations, os.pathsep-separated)
    before the shipped `fixtures/thresholds/`, so at equal specificity the cluster's entry wins."""
    extra = [Path(d) for d in os.environ.get("RLSMOKE_THRESHOLDS_DIR", "").split(os.pathsep) if d]
    for d in extra:
        if not d.is_dir():
            raise RlsmokeError(f"RLSMOKE_THRESHOLDS_DIR={d} is not a folder", rule="thresholds.dir",
                               fix="point it at a folder of thresholds *.json files (`rlsmoke calibrate --write`)")  # fmt: skip
    return [*extra, THRESHOLDS_DIR]


def matching_entry(key: Mapping[str, str], thresholds_dir: Path | None = None) -> tuple[Path, dict] | None:
    """The most specific entry whose key matches (exact fields beat "*"; the first read wins a tie)."""
    best, best_score = None, -1
    for directory in [thresholds_dir] if thresholds_dir else thresholds_dirs():
        for path, entry in read_entries(directory):
            ekey = entry["key"]
            if any(ekey.get(f, "*") not in ("*", key[f]) for f in KEY_FIELDS):
                continue
            score = sum(ekey.get(f, "*") != "*" for f in KEY_FIELDS)
            if score > best_score:
                best, best_score = (path, entry), score
    return best


def lookup_gates(key: RunKey, *, thresholds_dir: Path | None = None) -> Gates:
    """The gates of a run key. The most specific matching entry wins: exact fields beat "*". No match
    is an error that names the key and how to calibrate one.
    """
    best = matching_entry(key.to_json(), thresholds_dir)
    if best is None:
        raise RlsmokeError(
            f"no thresholds for {key.text()}",
            rule="thresholds.missing",
            fix="calibrate with `rlsmoke run CASE --repeat 10` then `rlsmoke calibrate DIR --write FILE`, and "
                "point RLSMOKE_THRESHOLDS_DIR at FILE's folder",
        )
    path, entry = best
    gates = tuple(_gate(g, entry.get("provenance", {})) for g in entry["gates"])
    return Gates(gates, key, str(path))
