"""Per-seed table of clean and twin runs, gated by this checkout's thresholds (markdown).

    python bench/twin_table.py RUN_DIR...     (folders of `rlsmoke run --repeat K`, e.g. from
                                               bench/gpu_twin_table.sh: clean*, twin*)

Each run folder's seeds are re-gated here against the thresholds file as it is now (a twin is judged
by its clean key: the inject is not part of the key), so the table shows what the suite would say.
A row per (folder kind, seed): the gated log-prob statistics, the verdict and the gates that failed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlsmoke.metrics import seed_records
from rlsmoke.runkey import RunKey
from rlsmoke.thresholds import lookup_gates

COLUMNS = {
    "abs diff": "logprob_abs_diff",
    "KL": "train_rollout_kl",
    "mean diff": "logprob_mean_diff",
    "slope": "logprob_slope",
}  # header: gate name (its value as the gate reads it)


def rows(run: Path) -> list[dict]:
    summary = json.loads((run / "summary.json").read_text())
    label = "clean" if summary.get("inject", "none") == "none" else summary["inject"]
    label += f" at {summary.get('rollout_temperature', 1.0):g}"
    records = seed_records(run)
    gates = lookup_gates(RunKey.from_summary(records[0].meta))
    first = int(summary.get("seed", 0))
    out = []
    for r, record in enumerate(records):
        verdict = gates.check(record)
        values = {res.gate.name: res.value for res in verdict.results}
        failed = [res.gate.name for res in verdict.results if not res.passed]
        out.append({"run": label, "seed": first + r, "verdict": "PASS" if verdict.passed else "FAIL",
                    "failed": failed, **{h: values.get(gate) for h, gate in COLUMNS.items()}})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    all_rows = sorted(
        (row for run in ap.parse_args().runs for row in rows(run)), key=lambda x: (x["run"], x["seed"])
    )
    print("| run | seed | " + " | ".join(COLUMNS) + " | verdict | failed gates |")
    print("|---" * (len(COLUMNS) + 4) + "|")
    for row in all_rows:
        cells = [f"{row[h]:+.4f}" if row[h] is not None else "-" for h in COLUMNS]
        print(f"| {row['run']} | {row['seed']} | " + " | ".join(cells)
              + f" | {row['verdict']} | {', '.join(row['failed']) or '-'} |")  # fmt: skip
    for label in sorted({row["run"] for row in all_rows}):
        mine = [row for row in all_rows if row["run"] == label]
        passed = sum(row["verdict"] == "PASS" for row in mine)
        print(f"\n{label}: {passed} of {len(mine)} seeds pass, {len(mine) - passed} fail", end="")
    print()


if __name__ == "__main__":
    main()
