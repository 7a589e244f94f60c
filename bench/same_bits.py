"""Whether a run's forward-side metrics are bit for bit a kept golden's: the rollout's and the train-rollout
log-prob comparisons of each seed, the values a forward decides. (A step's grad norm and loss sums also
pass through the attention backward, which is not deterministic on a GPU; they are left out.)

    python bench/same_bits.py RUN_DIR fixtures/golden/gpu/GOLDEN.json

Prints, per seed, the metrics that differ (none: "same bits"); exits 1 when any does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FORWARD_SIDE = ("rollout/", "train/train_rollout_")


def forward_side(lines: list[dict]) -> dict[tuple[int, str], float]:
    return {(line.get("repeat", 0), name): value for line in lines for name, value in line["metrics"].items()
            if name.startswith(FORWARD_SIDE)}  # fmt: skip


def main() -> int:
    run, golden = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    ran = forward_side([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()])
    kept = forward_side(golden["metrics"])
    seeds = sorted({seed for seed, _ in kept})
    differs = 0
    for seed in seeds:
        names = sorted(name for s, name in kept if s == seed)
        off = [
            f"{n} {ran.get((seed, n))!r} against {kept[(seed, n)]!r}"
            for n in names
            if ran.get((seed, n)) != kept[(seed, n)]
        ]
        differs += len(off)
        print(f"seed index {seed}: " + ("same bits" if not off else "; ".join(off)))
    print(f"against {golden['command']} at {golden['commit']}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
