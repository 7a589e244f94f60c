"""Wall time of pytest commands on two source trees, alternated, so a shared machine's load falls on both.

    python bench/bench_suite.py --before /tmp/before [--rounds 1] [-- PYTEST_ARGS ...]

`--before` is another checkout (e.g. `git archive OLD | tar -x -C /tmp/before`); this checkout is
"after". Each round runs `python -m pytest -q -p no:cacheprovider PYTEST_ARGS` once per tree, in the
tree, with the tree's `src` first on PYTHONPATH (the engine processes a test launches inherit it), and
prints each wall time, its outcome line, the load average around it, and after/before per round.
The checkpoint cache is shared, so it is warm for both once either has run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(tree: Path, pytest_args: list[str]) -> tuple[float, str, float, float]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    lines = out.stdout.strip().splitlines()
    return seconds, (lines[-1] if lines else f"exit {out.returncode}"), load_before, os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its src/ and tests/)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest gets (default: the whole suite)")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": ROOT}
    print(f"machine: {platform.machine()} {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}")
    print(f"command: python -m pytest -q -p no:cacheprovider {' '.join(args.pytest_args)}")
    for n in range(args.rounds):
        seconds = {}
        for name, tree in trees.items():
            seconds[name], outcome, load0, load1 = run_once(tree, args.pytest_args)
            print(f"round {n + 1} {name:6s} {seconds[name]:7.1f} s  load {load0:.1f} -> {load1:.1f}  {outcome}")
        print(f"round {n + 1} after/before {seconds['after'] / seconds['before']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
