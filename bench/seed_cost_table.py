"""Where a seed's time goes, from run folders' summary.json `timing` (markdown).

    python bench/seed_cost_table.py RUN_DIR...     (folders of `rlsmoke run [--repeat K] --out`)

A row per run (named by its folder): load, each seed, the first seed's phases, and the rollout's
generated tokens per second per GPU over the first seed (sampled tokens: samples x mean response length, per rollout).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PHASES = ("rollout", "forward_only", "train_step", "sync", "offload")


def row(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text()) | {"_run": str(run)}
    timing = summary["timing"]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = [ln for ln in lines if ln.get("repeat", 0) == 0 and ln["kind"] == "rollout"]
    n_samples = _flag(summary, "n_samples") * _flag(summary, "n_prompts")
    tokens = sum(n_samples * ln["metrics"]["rollout/response_len"] for ln in first)
    gpus = int(summary["num_gpus"]) if str(summary.get("num_gpus", "*")).isdigit() else 1
    trainer = summary.get("trainer") or ("megatron" if summary["launcher"].endswith("megatron") else "fsdp")
    return {"case": summary["case"], "trainer": trainer, "load": timing["load_s"],
            "seeds": timing["per_seed_s"], **{p: timing["phases_s"].get(p, 0.0) for p in PHASES},
            "tokens_per_s_per_gpu": tokens / max(timing["phases_s"]["rollout"], 1e-9) / gpus}  # fmt: skip


def _flag(summary: dict, name: str) -> int:
    if "shape" in summary:
        return int(summary["shape"][name])
    # summaries before `shape` existed: the config line of run.log
    config = (Path(summary["_run"]) / "run.log").read_text().splitlines()[0]
    return int(re.search(rf"{name}=(\d+)", config).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    print(
        "| run | case | trainer | load s | seeds s | "
        + " | ".join(f"{p} s" for p in PHASES)
        + " | tokens/s/GPU |"
    )
    print("|---" * (len(PHASES) + 6) + "|")
    for run in ap.parse_args().runs:
        if not (run / "summary.json").is_file():  # the run stopped before its first seed's records
            print(f"| {run.name} | no summary.json |" + " |" * (len(PHASES) + 4))
            continue
        r = row(run)
        seeds = ", ".join(f"{s:.1f}" for s in r["seeds"])
        print(f"| {run.name} | {r['case']} | {r['trainer']} | {r['load']:.1f} | {seeds} | "
              + " | ".join(f"{r[p]:.1f}" for p in PHASES) + f" | {r['tokens_per_s_per_gpu']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
