"""Time `rlsmoke plan` per case: in-process (the function) and end to end (a fresh interpreter).

    python bench/bench_plan.py [--repeat 20]

Goal: <= 50 ms per case, and neither torch nor transformers imported.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rlsmoke.cases import Case
from rlsmoke.models import MODEL_NAMES

PLATFORM_GPUS = (("nvidia", 8), ("rocm", 8), ("nvidia", 64))


def in_process(repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for name in MODEL_NAMES:
            for platform, n in PLATFORM_GPUS:
                Case(name, platform=platform, num_gpus=n).plan().to_json()
        times.append((time.perf_counter() - start) / (len(MODEL_NAMES) * len(PLATFORM_GPUS)))
    return statistics.median(times)


def end_to_end(repeat: int) -> tuple[float, float]:
    """A full `rlsmoke plan` process per case, and a bare `python -c pass` for the interpreter's share."""

    def run(argv):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return time.perf_counter() - start

    plan = [sys.executable, "-m", "rlsmoke.cli", "plan", "glm5-744b-a40b-4layer", "--platform", "rocm",
            "--num-gpus", "8", "--format", "json"]  # fmt: skip
    bare = [sys.executable, "-c", "pass"]
    return statistics.median(run(plan) for _ in range(repeat)), statistics.median(
        run(bare) for _ in range(repeat)
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    per_case = in_process(args.repeat)
    cli, bare = end_to_end(max(5, args.repeat // 2))
    heavy = [m for m in ("torch", "transformers", "ray") if m in sys.modules]
    print(f"plan, in process: {per_case * 1e3:.2f} ms per case (median of {args.repeat})")
    print(f"rlsmoke plan, whole process: {cli * 1e3:.0f} ms; bare interpreter: {bare * 1e3:.0f} ms; "
          f"rlsmoke's share: {(cli - bare) * 1e3:.0f} ms")  # fmt: skip
    print(f"heavy modules imported: {heavy or 'none'}")


if __name__ == "__main__":
    main()
