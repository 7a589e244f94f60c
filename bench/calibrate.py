"""Calibrate thresholds from repeated runs: `rlsmoke run CASE --repeat K --out DIR`, then

    python bench/calibrate.py DIR [DIR ...] [--write] [--markdown docs/calibration.md]

For each run folder (one key: case, platform, device, launcher, dtype, width) it reads every seed's
record from metrics.jsonl, prints min / median / max of each gated metric, and with --write replaces
that key's entry in fixtures/thresholds/builtin.json with measured bounds and their provenance.

The margin rule (MARGIN_RULE below) is the same for every key, so a bound says how it was made.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from datetime import date
from pathlib import Path

from rlsmoke.metrics import Record

THRESHOLDS = Path(__file__).resolve().parents[1] / "fixtures" / "thresholds" / "builtin.json"
DIFF_FACTOR = 2.0  # upper bounds: twice the worst seed
REWARD_LOW, REWARD_HIGH = 0.5, 1.5  # reward range: half the lowest, 1.5x the highest (at most 1)
MARGIN_RULE = (
    f"upper bounds on diff/kl metrics = {DIFF_FACTOR:g}x the max over the seeds (of the magnitude, for the "
    f"signed log-prob mean diff), rounded up to 2 significant digits; reward range = [{REWARD_LOW:g}x min, "
    f"{REWARD_HIGH:g}x max] capped at [0, 1]; ppo_kl at step 0, grad_norm and the weight sync keep their "
    "definitional bounds"
)
DEFINITIONAL = {"ppo_kl_step0", "pg_clipfrac_step0", "grad_norm", "weight_sync"}


def round_sig(x: float, up: bool) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    exp = math.floor(math.log10(abs(x))) - 1
    scaled = round(x / 10**exp, 9)  # 0.10000000000000009 is 0.1: float noise must not round up a digit
    return float(f"{(math.ceil(scaled) if up else math.floor(scaled)) * 10**exp:.3g}")  # no 0.35000000000000003


def definition(gate: dict) -> str:
    """A definitional gate's own words, without the seed statistics an earlier calibration put first."""
    return re.sub(r"^(\d+ seeds: [^;]*; )+", "", gate["provenance"])


def seeds_of(run: Path) -> list[Record]:
    """One record per seed of a `--repeat` run (lines carry a `repeat` key), or the single run."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_seed: dict[int, list[dict]] = {}
    for line in lines:
        by_seed.setdefault(line.get("repeat", 0), []).append(line)
    return [Record.from_lines(by_seed[k]) for k in sorted(by_seed)]


def summary_key(gate: dict) -> str:
    reduce = gate.get("reduce", "max")
    return gate["metric"] if reduce == "max" else f"{gate['metric']}@{reduce}"


def key_of(summary: dict) -> dict:
    return {
        "case": summary["case"], "platform": summary["platform"], "device": summary["device"],
        "launcher": summary["launcher"], "width": summary["width"],
        "dtype": summary["dtype"] if isinstance(summary["dtype"], str)
        else f"{summary['dtype']['rollout']}/{summary['dtype']['train']}",
    }  # fmt: skip


def calibrate(runs: list[Path], template: list[dict]) -> tuple[dict, list[tuple]]:
    """One entry from all the runs of one key (e.g. two `--repeat 5` runs with different --seed)."""
    summary = json.loads((runs[0] / "summary.json").read_text())
    key = key_of(summary)
    records = [rec for run in runs for rec in seeds_of(run)]
    rows, gates = [], []
    for tmpl in template:
        gate = {k: v for k, v in tmpl.items() if k not in ("max_observed", "provenance")}
        values = [r.value(gate["metric"], gate.get("reduce", "max")) for r in records]
        values = [v for v in values if v is not None]
        if not values:
            continue
        lo, med, hi = min(values), statistics.median(values), max(values)
        rows.append((gate["name"], summary_key(gate), lo, med, hi))
        if gate["name"] in DEFINITIONAL:
            pass
        elif gate["op"] in ("<=", "<"):
            gate["bound"] = round_sig(DIFF_FACTOR * hi, up=True)
        elif gate["op"] == "abs<":  # a signed metric: twice the largest magnitude
            gate["bound"] = round_sig(DIFF_FACTOR * max(abs(lo), abs(hi)), up=True)
        elif gate["name"] == "reward_min":
            gate["bound"] = max(0.0, round_sig(REWARD_LOW * lo, up=False))
        elif gate["name"] == "reward_max":
            gate["bound"] = min(1.0, round_sig(REWARD_HIGH * hi, up=True))
        gate["max_observed"] = hi
        gate["provenance"] = (f"{len(records)} seeds: min {lo:.4g}, median {med:.4g}, max {hi:.4g}"
                              + (f"; {definition(tmpl)}" if gate["name"] in DEFINITIONAL and "provenance" in tmpl else ""))
        gates.append(gate)
    v = summary["versions"]
    entry = {
        "key": key,
        "provenance": {
            "status": "calibrated" if len(records) >= 10 else f"provisional ({len(records)} runs)",
            "runs": len(records),
            "device": summary["device"],
            "date": date.today().isoformat(),
            "versions": f"torch {v['torch']}, transformers {v['transformers']}, python {v['python']}",
            "command": f"rlsmoke run {summary['case']} --platform {summary['platform']} --repeat {len(records)}"
                       + ("" if summary["width"] == "tiny" or summary["platform"] != "cpu" else " --no-tiny"),
            "margin_rule": MARGIN_RULE,
            "rollout_temperature": summary.get("rollout_temperature"),
        },
        "gates": gates,
    }  # fmt: skip
    return entry, rows


def gate_template(entries: list[dict], key: dict) -> list[dict]:
    """The gates a key gets: its own entry's, else its case's (MLA and GQA models differ), else the first."""
    for same in (lambda e: e["key"] == key, lambda e: e["key"].get("case") == key["case"], lambda e: True):
        for entry in entries:
            if same(entry):
                return entry["gates"]
    raise SystemExit("the thresholds file has no entries to take the gate list from")


def markdown(entry: dict, rows: list[tuple]) -> str:
    k = entry["key"]
    head = (f"### {k['case']} · {k['platform']} · {k['device']} · {k['dtype']} · {k['width']} "
            f"({entry['provenance']['runs']} seeds)\n\n")  # fmt: skip
    table = "| gate | metric | min | median | max | bound |\n|---|---|---|---|---|---|\n"
    bounds = {g["name"]: f"{g['op']} {g['bound']:.3g}" for g in entry["gates"]}
    for name, metric, lo, med, hi in rows:
        table += f"| {name} | `{metric}` | {lo:.4g} | {med:.4g} | {hi:.4g} | {bounds[name]} |\n"
    return head + table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--write", action="store_true", help="replace the keys' entries in the thresholds file")
    ap.add_argument("--markdown", type=Path, help="append the distribution tables to this file")
    args = ap.parse_args()
    data = json.loads(THRESHOLDS.read_text())
    by_key: dict[str, list[Path]] = {}
    for run in args.runs:
        by_key.setdefault(json.dumps(key_of(json.loads((run / "summary.json").read_text()))), []).append(run)
    out = []
    for key_text, runs in by_key.items():
        entry, rows = calibrate(runs, gate_template(data["entries"], json.loads(key_text)))
        out.append(markdown(entry, rows))
        print(out[-1])
        if args.write:
            data["entries"] = [e for e in data["entries"] if e["key"] != entry["key"]] + [entry]
    if args.write:
        tmp = THRESHOLDS.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(THRESHOLDS)  # atomic: a reader never sees half a file
    if args.markdown:
        with args.markdown.open("a") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
