"""Wall time of pytest commands on two source trees, or of two pytest commands, alternated, so a
shared machine's load falls on both.

    python bench/bench_suite.py --before /tmp/before [--rounds 1] [-- PYTEST_ARGS ...]
    python bench/bench_suite.py --adding "-n 2" [--rounds 1] [-- PYTEST_ARGS ...]

`--before` is another checkout (e.g. `git archive OLD | tar -x -C /tmp/before`); this checkout is
"after". Each round runs `python -m pytest -q -p no:cacheprovider PYTEST_ARGS` once per tree, in the
tree, with the tree's `src` first on PYTHONPATH (the engine processes a test launches inherit it), and
prints each wall time, its outcome line, the load average around it, and after/before per round;
the order alternates by round. The checkpoint cache is shared, so it is warm for both once either
has run.

`--adding ARGS` compares this checkout with itself: "before" runs PYTEST_ARGS, "after" runs them
with ARGS added (`--adding "-n 2"`: xdist against a serial session).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(tree: Path, pytest_args: list[str], log: Path) -> tuple[float, str, float, float]:
    """One timed pytest session; its whole output goes to `log`, its last line (the outcome) comes back."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *pytest_args]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - start
    lines = log.read_text().strip().splitlines()
    return seconds, (lines[-1] if lines else "no output"), load_before, os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--before", type=Path, help="the other checkout (its src/ and tests/)")
    which.add_argument(
        "--adding", metavar="ARGS", help='pytest arguments "after" adds on this checkout, e.g. "-n 2"'
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="where each session's whole output goes (default a new temporary folder)",
    )
    parser.add_argument(
        "pytest_args", nargs="*", help="after --: what pytest gets (default: the whole suite)"
    )
    args = parser.parse_args()
    added = shlex.split(args.adding or "")
    runs = {
        "before": (args.before.resolve() if args.before else ROOT, args.pytest_args),
        "after": (ROOT, [*args.pytest_args, *added]),
    }
    logs = args.logs or Path(tempfile.mkdtemp(prefix="bench-suite-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {platform.machine()} {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}"
    )
    print(
        f"command: python -m pytest -q -p no:cacheprovider {' '.join(args.pytest_args)}"
        + (f"; after adds {' '.join(added)}" if added else "")
        + f"; each session's output in {logs}"
    )
    ratios = []
    for n in range(args.rounds):
        seconds = {}
        order = (
            list(runs) if n % 2 == 0 else list(reversed(runs))
        )  # neither always runs on a machine the other warmed
        for name in order:
            tree, pytest_args = runs[name]
            log = logs / f"round{n + 1}-{name}.log"
            seconds[name], outcome, load0, load1 = run_once(tree, pytest_args, log)
            print(
                f"round {n + 1} {name:6s} {seconds[name]:7.1f} s  load {load0:.1f} -> {load1:.1f}  {outcome}",
                flush=True,
            )
            for line in log.read_text().splitlines():
                if line.startswith(("FAILED ", "ERROR ")):
                    print(f"    {line}", flush=True)
        ratios.append(seconds["after"] / seconds["before"])
        print(f"round {n + 1} after/before {ratios[-1]:.2f}", flush=True)
    if len(ratios) > 1:
        print(
            f"after/before: median {statistics.median(ratios):.2f}, rounds {' '.join(f'{r:.2f}' for r in ratios)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
