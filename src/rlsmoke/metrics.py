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
from rlsmoke.shipped import FIXTURES

THRESHOLDS_DIR = FIXTURES / "thresholds"
SCHEMA_VERSION = 1
KINDS = ("rollout", "step")
OPS = ("<", "<=", ">", ">=", "abs<", "finite>")
REDUCES = ("max", "min", "first", "last", "absmax")
# num_gpus: FSDP2 over N ranks reduces grads in bf16 and splits the prompts; an entry without it
# matches any count, and one calibrated at N (`rlsmoke calibrate` writes it) wins at N.
KEY_FIELDS = ("case", "platform", "device", "launcher", "dtype", "width", "num_gpus")

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
            for k in ("case", "platform", "device", "launcher", "dtype", "seed", "width", "num_gpus")
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


# --- gates ------------------------------------------------------------------------------------


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
        """The flat key of the gated value: the metric, suffixed when not the default max."""
        return self.metric if self.reduce == "max" else f"{self.metric}@{self.reduce}"

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
    key: Mapping[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]

    def values(self) -> dict[str, float | None]:
        return {r.gate.summary_key: _jsonable(r.value) for r in self.results}

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
                f"all {len(self.results)} gates passed ({key_text(self.key)}); artifacts: {self.artifacts}"
            )
        lines = [f"{len(self.failures)} of {len(self.results)} gates failed ({key_text(self.key)}):"]
        for r in self.failures:
            lines.append(f"  - {r.line()}{' (' + r.note + ')' if r.note else ''}")
            lines.append(f"    provenance: {r.gate.provenance}")
        lines.append(f"artifacts: {self.artifacts}")
        lines.append("next: open run.log and metrics.jsonl there; if the bound itself is stale, recalibrate: "
                     "`rlsmoke run CASE --repeat 10`, then `rlsmoke calibrate DIR --write FILE`")  # fmt: skip
        return "\n".join(lines)


def key_text(key: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in key.items())


@dataclass(frozen=True)
class Gates:
    gates: tuple[Gate, ...]
    key: Mapping[str, str] = field(default_factory=dict)
    source: str = ""

    def check(self, record: Record) -> Verdict:
        results = tuple(g.evaluate(record.value(g.metric, g.reduce)) for g in self.gates)
        return Verdict(results, record.artifacts, self.key)

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


def _default_key(case, platform, device, launcher, dtype, width, num_gpus=None) -> dict[str, str]:
    name = getattr(case, "name", None) or (case.meta.get("case") if isinstance(case, Record) else case)
    if isinstance(case, Record):
        m = case.meta
        platform = platform or m.get("platform")
        device = device or m.get("device")
        launcher = launcher or m.get("launcher")
        dtype = dtype or m.get("dtype")
        width = width or m.get("width")
        num_gpus = num_gpus or m.get("num_gpus")
    elif hasattr(case, "platform"):
        num_gpus = num_gpus or getattr(case, "num_gpus", None)
        platform = platform or case.platform
        width = width or ("tiny" if getattr(case, "tiny", False) else "full")
    platform = platform or "cpu"
    if isinstance(dtype, Mapping):
        dtype = f"{dtype.get('rollout')}/{dtype.get('train')}"
    if device is None:
        if platform == "cpu":
            device = "CPU"
        else:
            from rlsmoke.platforms import detect

            device = detect().device
    key = {"case": str(name), "platform": platform, "device": device, "launcher": launcher or "builtin",
           "dtype": dtype or ("float32/float32" if platform == "cpu" else "bfloat16/float32"),
           "width": width or ("tiny" if platform == "cpu" else "full"),
           "num_gpus": str(num_gpus) if num_gpus is not None else "*"}  # fmt: skip
    return key


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


def gates_for(case, *, platform: str | None = None, device: str | None = None, launcher: str | None = None,
              dtype: str | Mapping | None = None, width: str | None = None, num_gpus: int | str | None = None,
              thresholds_dir: Path | None = None) -> Gates:  # fmt: skip
    """The gates of a case: a name, a `Case`, or a `Record` (its summary names the key).

    The most specific matching entry wins: exact fields beat "*". No match is an error that names
    the key and how to calibrate one.
    """
    key = _default_key(case, platform, device, launcher, dtype, width, num_gpus)
    best = matching_entry(key, thresholds_dir)
    if best is None:
        raise RlsmokeError(
            f"no thresholds for {key_text(key)}",
            rule="thresholds.missing",
            fix="calibrate with `rlsmoke run CASE --repeat 10` then `rlsmoke calibrate DIR --write FILE`, and "
                "point RLSMOKE_THRESHOLDS_DIR at FILE's folder",
        )
    path, entry = best
    gates = tuple(_gate(g, entry.get("provenance", {})) for g in entry["gates"])
    return Gates(gates, key, str(path))
