"""A sqlite history of runs and the band gate against the mean of the last K trusted runs. A run is
trusted when asked (the nightly job) and it passed every gate, so a regression never becomes the
baseline. Unlike upstream, the band also gates ROCm."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.runkey import SERIES  # the series a band is computed over; commit is per run

DEFAULT_K = 20  # upstream: the mean of the last <= 20 trusted nightly runs


@dataclass(frozen=True)
class Band:
    """Two-sided band around the baseline mean: each side allows max(rel * |mean|, abs)."""

    up_rel: float
    up_abs: float
    down_rel: float
    down_abs: float

    def bounds(self, mean: float) -> tuple[float, float]:
        return (mean - max(self.down_rel * abs(mean), self.down_abs),
                mean + max(self.up_rel * abs(mean), self.up_abs))  # fmt: skip


# Upstream Miles' history gate (miles-launch.md, "What a one-step CI run asserts upstream").
_KL_BAND = Band(0.5, 0.02, 0.8, 0.02)
BANDS: dict[str, Band] = {
    "train/grad_norm": Band(0.5, 0.1, 0.8, 0.1),
    "train/ppo_kl": _KL_BAND,
    "train/train_rollout_logprob_abs_diff": _KL_BAND,
    "train/train_rollout_kl": _KL_BAND,
    "rollout/raw_reward": Band(0.5, 0.05, 0.2, 0.05),
}

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    "case" TEXT NOT NULL, platform TEXT NOT NULL, device TEXT NOT NULL, launcher TEXT NOT NULL,
    "commit" TEXT NOT NULL,
    trusted INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    metrics TEXT NOT NULL,   -- {metric: value} of the band metrics
    gates TEXT NOT NULL,     -- [{name, metric, op, bound, value, passed}] of the thresholds
    artifacts TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_key ON runs ("case", platform, device, launcher, trusted, id);
"""


def connect(db: str | Path) -> sqlite3.Connection:
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(db), timeout=60)  # xdist workers write to one file: wait, don't fail
    conn.row_factory = sqlite3.Row
    conn.executescript(SCHEMA)
    return conn


def band_values(record) -> dict[str, float]:
    """Each band metric at each step, keyed `metric@index`: as Miles' gate since #2290, per step."""
    return {f"{metric}@{i}": v for metric in BANDS for _, i, v in record.series(metric)}


@dataclass(frozen=True)
class BandResult:
    metric: str  # a band key: the metric, `@step` where it is judged per step
    value: float
    mean: float
    lower: float
    upper: float
    runs: int  # trusted runs in the baseline

    @property
    def passed(self) -> bool:
        return math.isfinite(self.value) and self.lower <= self.value <= self.upper

    def line(self) -> str:
        return (f"{self.metric} = {self.value:.4g}, outside [{self.lower:.4g}, {self.upper:.4g}] around the mean "
                f"{self.mean:.4g} of the last {self.runs} trusted runs" if not self.passed else
                f"{self.metric} = {self.value:.4g} within [{self.lower:.4g}, {self.upper:.4g}] ({self.runs} runs)")  # fmt: skip


def baseline(conn: sqlite3.Connection, key: Mapping[str, str], k: int = DEFAULT_K) -> list[dict[str, float]]:
    """The band metrics of the last `k` trusted runs of `key`, newest first."""
    rows = conn.execute(
        'SELECT metrics FROM runs WHERE "case"=? AND platform=? AND device=? AND launcher=? AND trusted=1 '
        "ORDER BY id DESC LIMIT ?", (*(str(key[f]) for f in SERIES), k),
    ).fetchall()  # fmt: skip
    return [json.loads(r["metrics"]) for r in rows]


def check_bands(values: Mapping[str, float], runs: list[Mapping[str, float]]) -> list[BandResult]:
    """One result per band key both this run and the baseline have; no baseline, no result."""
    results = []
    for key in values:  # band_values gives them in BANDS order, step by step
        band = BANDS.get(key.split("@", 1)[0])  # `train/grad_norm@0`'s band is `train/grad_norm`'s
        past = [r[key] for r in runs if key in r and math.isfinite(r[key])]
        if band is None or not past:
            continue
        mean = sum(past) / len(past)
        results.append(BandResult(key, float(values[key]), mean, *band.bounds(mean), len(past)))
    return results


def add_run(conn: sqlite3.Connection, key: Mapping[str, str], *, commit: str, trusted: bool, verdict: str,
            values: Mapping[str, float], gates: list[dict] = (), artifacts: str = "") -> None:  # fmt: skip
    conn.execute(
        'INSERT INTO runs (created, "case", platform, device, launcher, "commit", trusted, verdict, metrics, gates, '
        "artifacts) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (time.time(), *(str(key[f]) for f in SERIES), commit, int(trusted), verdict,
         json.dumps(dict(values)), json.dumps(list(gates)), artifacts),
    )  # fmt: skip
    conn.commit()


def record_and_check(db: str | Path, record, verdict, *, commit: str, trusted: bool) -> list[BandResult]:
    """Band-check `record` against the trusted baseline of its key, then store it."""
    key = dict(zip(SERIES, verdict.key.series(), strict=True))
    values = band_values(record)
    with closing(connect(db)) as conn:
        results = check_bands(values, baseline(conn, key))
        ok = verdict.passed and all(r.passed for r in results)
        gates = [{"name": r.gate.name, "metric": r.gate.summary_key, "op": r.gate.op, "bound": r.gate.bound,
                  "value": r.value if r.value is None or math.isfinite(r.value) else None, "passed": r.passed}
                 for r in verdict.results]  # fmt: skip
        add_run(conn, key, commit=commit, trusted=trusted and ok, verdict="PASS" if ok else "FAIL", values=values,
                gates=gates, artifacts=str(record.artifacts))  # fmt: skip
    return results


def report(failed: list[BandResult]) -> str:
    lines = [f"{len(failed)} history band(s) failed:"] + [f"  - {r.line()}" for r in failed]
    lines.append("next: compare with the last trusted run's artifacts; if the change is intended, "
                 "mark a run of the new behaviour trusted (--history-trusted) to move the baseline")  # fmt: skip
    return "\n".join(lines)


# The columns `rlsmoke report` reads; a history without them is another schema.
REPORT_COLUMNS = ("id", *SERIES, "trusted", "metrics", "gates")


def runs(db: str | Path) -> list[dict]:
    """Every run, oldest first, decoded (for `rlsmoke report`); read only, any fault one line."""
    from rlsmoke.errors import RlsmokeError

    db = Path(db)
    fix = "pass the sqlite file written by `pytest --history DB`"
    try:
        with closing(sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True, timeout=60)) as conn:
            conn.row_factory = sqlite3.Row
            columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
            if missing := [c for c in REPORT_COLUMNS if c not in columns]:
                what = "no runs table" if not columns else f"a runs table without {', '.join(missing)}"
                raise RlsmokeError(f"history={db} has {what}", rule="history.schema",
                                   fix=f"{fix} (this rlsmoke reads the columns {', '.join(REPORT_COLUMNS)})")  # fmt: skip
            rows = conn.execute("SELECT * FROM runs ORDER BY id").fetchall()
    except sqlite3.DatabaseError as exc:  # not a database, encrypted, corrupt
        raise RlsmokeError(f"history={db} is not a readable sqlite database ({exc})", rule="history.format",
                           fix=fix) from None  # fmt: skip
    out = []
    for r in rows:
        d = dict(r)
        try:
            d["metrics"], d["gates"] = json.loads(d["metrics"]), json.loads(d["gates"])
            if not isinstance(d["metrics"], dict) or not isinstance(d["gates"], list):
                raise ValueError("metrics is not an object or gates not a list")
        except (TypeError, ValueError) as exc:
            raise RlsmokeError(f"history={db} run id {d['id']}: its metrics or gates are not the JSON a run writes "
                               f"({exc})", rule="history.row", fix="delete that row, or pass another history") from None  # fmt: skip
        out.append(d)
    return out
