"""Time `pytest --collect-only` of the whole suite in a fresh interpreter, as a user or CI pays it.

    python bench/bench_collect.py [--repeat 5]

Goal: <= 3 s; collection imports neither torch nor ray (every test module imports only rlsmoke's
light modules, and the plugin imports heavy things inside hooks).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 3.0


def collect_once(paths: list[str]) -> tuple[float, str]:
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths]
    start = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"collection failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return seconds, out.stdout.strip().splitlines()[-1]


def heavy_imports(paths: list[str]) -> str:
    """Heavy modules loaded by collecting, read off the collecting interpreter itself."""
    code = (f"import sys, pytest; pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *{paths!r}]); "
            "print('HEAVY', sorted(m for m in ('torch', 'ray', 'matplotlib', 'transformers') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    line = next((x for x in out.stdout.splitlines() if x.startswith("HEAVY")), "HEAVY ?")
    return line.removeprefix("HEAVY ").strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "paths", nargs="*", help="test paths (default: the whole suite, pyproject's testpaths)"
    )
    args = parser.parse_args()
    collect_once(args.paths)  # warm the filesystem and bytecode caches, as every run after the first is
    runs = [collect_once(args.paths) for _ in range(args.repeat)]
    times = [t for t, _ in runs]
    median = statistics.median(times)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"command: python -m pytest --collect-only -q {' '.join(args.paths)}  ({runs[-1][1]})")
    print(f"collect: median {median:.2f} s, min {min(times):.2f} s, max {max(times):.2f} s over {args.repeat} runs "
          f"(goal <= {GOAL_S:.0f} s)")  # fmt: skip
    print(f"heavy modules imported by collection: {heavy_imports(args.paths)}")
    return 0 if median <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
