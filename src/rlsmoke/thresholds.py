"""Gates as data: thresholds files (`fixtures/thresholds/`, `RLSMOKE_THRESHOLDS_DIR`), the gates of a run
key, and a `Verdict` listing every failure. No torch."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.metrics import Record
from rlsmoke.paths import check_name
from rlsmoke.runkey import FIELDS as KEY_FIELDS
from rlsmoke.runkey import RunKey
from rlsmoke.shipped import FIXTURES

THRESHOLDS_DIR = FIXTURES / "thresholds"
SCHEMA_VERSION = 1
OPS = ("<", "<=", ">", ">=", "abs<", "finite>")
REDUCES = ("max", "min", "first", "last", "absmax")


def summary_key(metric: str, reduce: str) -> str:
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
        margin = {"<": b - v, "<=": b - v, "abs<": b - abs(v)}.get(self.op, v - b)
        # every comparison with a NaN is False: a NaN value fails
        passed = {"<": v < b, "<=": v <= b, ">": v > b, ">=": v >= b, "abs<": abs(v) < b,
                  "finite>": math.isfinite(v) and v > b}[self.op]  # fmt: skip
        return GateResult(self, value, passed, margin if math.isfinite(margin) else math.nan)


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

    @property
    def shown(self) -> str:
        return "missing" if self.value is None else f"{self.value:.4g}"

    def cells(self) -> tuple[str, str, str, str, str]:
        op = {"abs<": "|x|<", "finite>": "fin>"}.get(self.gate.op, self.gate.op)
        g = self.gate
        return g.name, g.summary_key, self.shown, f"{op} {g.bound:.4g}", f"{self.margin:.3g}"

    def line(self) -> str:
        op = {"abs<": "|x| <", "finite>": "finite and >"}.get(self.gate.op, self.gate.op)
        return f"{self.gate.name}: {self.gate.summary_key} = {self.shown}, bound {op} {self.gate.bound:.4g}, margin {self.margin:.3g}"


def aligned(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """Rows of text as columns, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


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

    def summary_fields(self) -> dict[str, object]:
        """What a gated run's summary.json says about its gates (`update_summary`)."""
        return {"metrics": {r.gate.summary_key: _jsonable(r.value) for r in self.results},
                "gates": [r.to_json() for r in self.results], "thresholds": self.source,
                "verdict": "PASS" if self.passed else "FAIL"}  # fmt: skip

    def table(self) -> str:
        rows = [("gate", "metric", "value", "bound", "margin", "")]
        rows += [(*r.cells(), "PASS" if r.passed else "FAIL") for r in self.results]
        return "\n".join(aligned(rows) + [f"verdict: {'PASS' if self.passed else 'FAIL'}"])

    def report(self) -> str:
        key = self.key.text() if self.key else "no key"
        if self.passed:
            return f"all {len(self.results)} gates passed ({key}); artifacts: {self.artifacts}"
        lines = [f"{len(self.failures)} of {len(self.results)} gates failed ({key}):"]
        for r in self.failures:
            lines.append(f"  - {r.line()}{' (' + r.note + ')' if r.note else ''}")
            lines.append(f"    provenance: {r.gate.provenance}")
        lines.append(f"artifacts: {self.artifacts}")
        lines.append("next: open run.log and metrics.jsonl there; if the bound itself is stale, recalibrate: "
                     "`rlsmoke run CASE --repeat 10`, then `rlsmoke calibrate DIR --write FILE`")  # fmt: skip
        return "\n".join(lines)


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


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:  # a key twice: JSON's last would win unseen
    keys = [k for k, _ in pairs]
    for key in (k for k in keys if keys.count(k) > 1):
        raise RlsmokeError(
            f"{key!r} twice in the object {json.dumps(dict(pairs))[:120]}", rule="thresholds.duplicate_key"
        )
    return dict(pairs)


def load_json(path: Path) -> object:
    """A thresholds file's JSON, each object's keys unique (`thresholds.duplicate_key` otherwise)."""
    try:
        return json.loads(path.read_text(), object_pairs_hook=_unique_keys)
    except RlsmokeError as exc:
        raise RlsmokeError(f"thresholds={path} has the key {exc}", rule="thresholds.duplicate_key",
                           fix="keep one of the two: JSON would silently take the last") from None  # fmt: skip


def read_entries(directory: Path) -> list[tuple[Path, dict]]:
    entries = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            doc = load_json(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise RlsmokeError(f"thresholds={path} cannot be read ({exc})", rule="thresholds.json",
                               fix="make it readable, or move it out of the thresholds folder") from None  # fmt: skip
        except json.JSONDecodeError as exc:
            raise RlsmokeError(f"thresholds={path} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                               rule="thresholds.json",
                               fix="fix the file (`rlsmoke calibrate DIR --write FILE` writes a valid one)") from None  # fmt: skip
        if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION or "entries" not in doc:
            doc = doc if isinstance(doc, dict) else {}
            raise RlsmokeError(
                f"thresholds={path} has schema_version={doc.get('schema_version')!r}",
                rule="thresholds.schema",
                fix=f"write schema_version {SCHEMA_VERSION} with an entries list",
            )
        for entry in doc["entries"] if isinstance(doc["entries"], list) else [None]:
            if not (isinstance(entry, dict) and isinstance(entry.get("key", {}), dict)
                    and isinstance(entry.get("gates"), list)):  # fmt: skip
                raise RlsmokeError(f"thresholds={path} has an entry that is not {{key: {{...}}, gates: [...]}}: "
                                   f"{json.dumps(entry)[:80]}", rule="thresholds.schema",
                                   fix="write each entry as an object with a key object and a gates list")  # fmt: skip
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


def gate_from_spec(spec: dict, entry_provenance: dict, source: Path) -> Gate:
    where = f"thresholds={source}: "
    if not isinstance(spec, dict):
        raise RlsmokeError(f"{where}gate {spec!r} is not an object", rule="thresholds.schema",
                           fix="write each gate as {name, metric, op, bound}")  # fmt: skip
    unknown = set(spec) - {"name", "metric", "op", "bound", "reduce", "max_observed", "provenance"}
    missing = [k for k in ("name", "metric", "op", "bound") if k not in spec]
    if unknown or missing:
        raise RlsmokeError(
            f"{where}gate {spec.get('name')!r} has " + "; ".join(
                ([f"unknown fields {sorted(unknown)}"] if unknown else []) + ([f"no {', '.join(missing)}"] if missing else [])),
            rule="thresholds.schema", fix="write each gate as {name, metric, op, bound} (reduce, provenance optional)",
        )  # fmt: skip
    if isinstance(spec["bound"], bool) or not isinstance(spec["bound"], (int, float)):
        raise RlsmokeError(f"{where}gate {spec['name']!r} has bound={spec['bound']!r}, not a number",
                           rule="thresholds.schema", fix="write the bound as a number")  # fmt: skip
    if not math.isfinite(spec["bound"]):  # JSON's NaN and Infinity parse: a NaN bound fails every value
        raise RlsmokeError(f"{where}gate {spec['name']!r} has bound={spec['bound']}, not a finite number",
                           rule="thresholds.bound", fix="write a finite bound (`rlsmoke calibrate` derives one)")  # fmt: skip
    if (own := spec.get("provenance")) is None:
        p = entry_provenance
        own = (f"{p.get('status', '?')}: {p.get('runs', '?')} runs on {p.get('device', '?')}, {p.get('date', '?')}, "
               f"{p.get('versions', '?')}; max observed {spec.get('max_observed', '?')}; {p.get('margin_rule', '')}")  # fmt: skip
    name, metric, op = spec["name"], spec["metric"], spec["op"]
    return Gate(name, metric, op, float(spec["bound"]), spec.get("reduce", "max"), own.strip("; "))


def thresholds_dirs() -> list[Path]:
    """`RLSMOKE_THRESHOLDS_DIR` (os.pathsep-separated) before the shipped folder: the cluster's entry wins."""
    extra = [Path(d) for d in os.environ.get("RLSMOKE_THRESHOLDS_DIR", "").split(os.pathsep) if d]
    for d in extra:
        check_name(d, "RLSMOKE_THRESHOLDS_DIR")  # a name too long, a loop: their own rule, not "not a folder"
        if not d.is_dir():
            raise RlsmokeError(f"RLSMOKE_THRESHOLDS_DIR={d} is not a folder", rule="thresholds.dir",
                               fix="point it at a folder of thresholds *.json files (`rlsmoke calibrate --write`)")  # fmt: skip
    return [*extra, THRESHOLDS_DIR]


def all_entries(directories: list[Path] | None = None) -> list[tuple[Path, dict]]:
    """Every entry, each key once: a key twice within the shipped or within the cluster's folders is
    refused with both places named; a cluster's entry overrides a shipped one."""
    directories = thresholds_dirs() if directories is None else directories
    entries, seen = [], {}
    for directory in directories:
        shipped = Path(directory).resolve() == THRESHOLDS_DIR.resolve()
        numbers: dict[Path, int] = {}
        for path, entry in read_entries(directory):
            number = numbers[path] = numbers.get(path, 0) + 1  # the entry's place in its file
            key = tuple(str(entry["key"].get(f, "*")) for f in KEY_FIELDS)
            if (first := seen.get((shipped, key))) is not None:
                raise RlsmokeError(f"thresholds={path} entry {number} has the key of {first}: "
                                   f"{json.dumps(entry['key'], sort_keys=True)}", rule="thresholds.duplicate_key",
                                   fix="keep one entry per key: merge the two or remove one")  # fmt: skip
            seen[(shipped, key)] = f"{path} entry {number}"
            entries.append((path, entry))
    return entries


def check_thresholds(key: RunKey, logged: frozenset[str]) -> None:
    """Every thresholds file a run reads, checked before the run: finite bounds, unique names and keys, and
    every gate of an entry that applies to `key` on a metric its launcher logs (`logged`)."""
    for path, entry in all_entries():
        names = [spec.get("name") if isinstance(spec, dict) else None for spec in entry["gates"]]
        if twice := sorted({str(n) for n in names if names.count(n) > 1}):
            raise RlsmokeError(f"thresholds={path} has an entry with the gate name(s) {', '.join(twice)} twice: "
                               f"{json.dumps(entry['key'], sort_keys=True)}", rule="thresholds.gate_names",
                               fix="give each gate of an entry its own name")  # fmt: skip
        gates = [gate_from_spec(spec, entry.get("provenance", {}), path) for spec in entry["gates"]]
        if not _applies(entry["key"], key.to_json()):
            continue
        for gate in gates:
            if gate.metric not in logged:
                raise RlsmokeError(
                    f"thresholds={path}: gate {gate.name!r} reads metric={gate.metric!r}, which launcher="
                    f"{key.launcher} never logs (entry {json.dumps(entry['key'], sort_keys=True)})",
                    rule="thresholds.metric_logged",
                    fix=f"gate one of the logged metrics ({', '.join(sorted(logged))}), or key the entry to the "
                        "launcher that logs it")  # fmt: skip


def _applies(entry_key: Mapping[str, str], key: Mapping[str, str]) -> bool:
    return all(entry_key.get(f, "*") in ("*", key.get(f, "*")) for f in KEY_FIELDS)


def same_key(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Two entry keys name the same runs: a field left out is "*" (older one-device entries have no count)."""
    return all(a.get(f, "*") == b.get(f, "*") for f in KEY_FIELDS)


def matching_entry(key: Mapping[str, str], thresholds_dir: Path | None = None) -> tuple[Path, dict] | None:
    """The most specific entry whose key matches (exact fields beat "*"; the first read wins a tie)."""
    entries = all_entries([thresholds_dir] if thresholds_dir else None)
    matches = [(p, e) for p, e in entries if _applies(e["key"], key)]
    return max(matches, key=lambda m: sum(m[1]["key"].get(f, "*") != "*" for f in KEY_FIELDS), default=None)


def calibrated_decode(key: RunKey) -> str | None:
    """The rollout decode the key's thresholds were calibrated from (`generate` for an entry that names none,
    as every entry before the static decode); None where no entry matches."""
    if (best := matching_entry(key.to_json())) is None:
        return None
    return best[1].get("provenance", {}).get("rollout_decode", "generate")


def lookup_gates(key: RunKey, *, thresholds_dir: Path | None = None) -> Gates:
    """The gates of a run key: the most specific matching entry wins; no match is an error."""
    if (best := matching_entry(key.to_json(), thresholds_dir)) is None:
        raise RlsmokeError(
            f"no thresholds for {key.text()}",
            rule="thresholds.missing",
            fix="calibrate with `rlsmoke run CASE --repeat 10` then `rlsmoke calibrate DIR --write FILE`, and "
            "point RLSMOKE_THRESHOLDS_DIR at FILE's folder",
        )
    path, entry = best
    gates = tuple(gate_from_spec(g, entry.get("provenance", {}), path) for g in entry["gates"])
    return Gates(gates, key, str(path))
