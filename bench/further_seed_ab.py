"""A further seed's seconds with one of this engine's choices undone, against the engine as built, on one
machine in one call: each variant is its own `rlsmoke run --repeat K --records-only` process, the variants
taking turns so that drift on a shared host falls on all of them.

    python bench/further_seed_ab.py glm5-744b-a40b-4layer --tiny --trainer megatron --out OUT [--repeat 6]

Variants (`--variants`, default all): `built` (as shipped); `nan-fill` (deterministic mode's NaN fill on
every seed, not the first only: `rlsmoke.engine.reuse.first_seed_only` undone); `multinomial` (the rollout
drawing each group's tokens with `torch.multinomial`, its two host reads a group and a step);
`group-reads` (the train step reading each group's sums and finite check as the group ends); with
`--trainer megatron` also `sequential-experts` (megatron-core's `SequentialMLP` loop for the routed
experts, not `GroupedExperts`). Prints, per variant, the further seeds (the first pays first-use costs),
their median phases and whether its metrics.jsonl is built's of the same turn, byte for byte; OUT keeps
each run's records.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

UNDO = {
    "built": "",
    "nan-fill": "import rlsmoke.engine.reuse as r; r.first_seed_only = lambda: None",
    "multinomial": (
        "import torch; from rlsmoke.engine.rollout import GroupSampler\n"
        "def draw(self, input_ids, scores):\n"
        "    probs = torch.softmax(scores / self.temperature, dim=-1)\n"
        "    chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)\n"
        "    for rows, g in zip(self.rows, self.generators):\n"
        "        chosen[rows] = torch.multinomial(probs[rows], num_samples=1, generator=g)[:, 0]\n"
        "    return torch.full_like(scores, float('-inf')).scatter_(1, chosen[:, None], 0.0)\n"
        "GroupSampler.__call__ = draw"
    ),
    "group-reads": (
        "import torch; from rlsmoke.engine.train import StepSums\n"
        "add = StepSums.add\n"
        "def read_now(self, group, loss, sums):\n"
        "    add(self, group, loss, sums); [v.item() for v in sums.values()]; bool(torch.isfinite(loss))\n"
        "StepSums.add = read_now"
    ),
    "sequential-experts": (
        "import rlsmoke.engine.megatron.model as m; "
        "from megatron.core.transformer.moe.experts import SequentialMLP; m.experts_cls = lambda: SequentialMLP"
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--trainer", default="fsdp")
    ap.add_argument("--platform", default="nvidia")
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--turns", type=int, default=2, help="runs of each variant, taking turns")
    ap.add_argument("--variants", default=",".join(UNDO), help="comma-separated; built is always run")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    asked = ["built"] + [v for v in args.variants.split(",") if v != "built"]
    unknown = [v for v in asked if v not in UNDO]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(UNDO)}")
    variants = [v for v in asked if v != "sequential-experts" or args.trainer == "megatron"]
    flags = [args.case, "--platform", args.platform, "--num-gpus", "1", "--trainer", args.trainer,
             "--repeat", str(args.repeat), "--rollout-decode", "static", "--records-only"]  # fmt: skip
    if args.tiny:
        flags.append("--tiny")
    further: dict[str, list[float]] = {v: [] for v in variants}
    phases: dict[str, list[dict]] = {v: [] for v in variants}
    same_bits: dict[str, list[bool]] = {v: [] for v in variants}
    for turn in range(args.turns):
        for v in variants:
            out = args.out / f"{v}-{turn}"
            code = f"{UNDO[v]}\nimport sys\nfrom rlsmoke.cli import main\nsys.exit(main())"
            done = subprocess.run([sys.executable, "-c", code, "run", *flags, "--out", str(out)], check=False)
            summary = out / "summary.json"
            if done.returncode != 0 or not summary.is_file():
                print(f"{v} turn {turn}: exit {done.returncode}, no records", flush=True)
                continue
            timing = json.loads(summary.read_text())["timing"]
            further[v] += timing["per_seed_s"][1:]
            phases[v] += timing["seed_phases_s"][1:]
            built = args.out / f"built-{turn}" / "metrics.jsonl"
            if built.is_file():
                same_bits[v].append(built.read_bytes() == (out / "metrics.jsonl").read_bytes())
            print(f"{v} turn {turn}: seeds {[round(s, 2) for s in timing['per_seed_s']]}", flush=True)
    base = statistics.median(further["built"]) if further["built"] else None
    print(f"\n{args.case}{' tiny' if args.tiny else ''}, {args.trainer}: a further seed, median of "
          f"{args.turns} runs x {args.repeat - 1} seeds")  # fmt: skip
    for v in variants:
        if not further[v]:
            continue
        med = statistics.median(further[v])
        names = sorted({k for p in phases[v] for k in p})
        by_phase = {k: round(statistics.median(p.get(k, 0.0) for p in phases[v]), 3) for k in names}
        ratio = f", {med / base:.2f}x built" if base else ""
        bits = f"; metrics as built's in {sum(same_bits[v])} of {len(same_bits[v])} turns" * (v != "built")
        print(f"  {v}: {med:.3f} s{ratio}; phases {by_phase}{bits}")


if __name__ == "__main__":
    main()
