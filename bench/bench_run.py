"""Time to verdict of `rlsmoke run` (the README's main job), process start to exit, on this machine.

    python bench/bench_run.py                      # colocate main job, 3 runs
    python bench/bench_run.py --ray --runs 2       # plus Ray async placement (2 logical GPUs)

Prints one Markdown table row per variant: median and min seconds, the machine, the load average
(the box may be shared; a loaded machine inflates every figure) and the command.
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

CASE = "glm5-744b-a40b-4layer"
VARIANTS = {
    "colocate (main job)": ["--platform", "cpu"],
    "async, Ray, 2 logical GPUs": ["--platform", "cpu", "--mode", "async", "--num-gpus", "2"],
}


def time_one(argv: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        proc = subprocess.run([*argv, "--out", out], capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench: {shlex.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also time the async variant on Ray")
    args = parser.parse_args()
    rlsmoke = [sys.executable, "-m", "rlsmoke.cli"]
    time_one([*rlsmoke, "run", CASE, "--platform", "cpu"])  # warm: the checkpoint cache and the page cache
    machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}"
    print("| variant | median s | min s | runs | load avg (1 min) before | machine | command |")
    print("|---|---|---|---|---|---|---|")
    for name, flags in VARIANTS.items():
        if "Ray" in name and not args.ray:
            continue
        load = os.getloadavg()[0]
        times = [time_one([*rlsmoke, "run", CASE, *flags]) for _ in range(args.runs)]
        command = shlex.join(["rlsmoke", "run", CASE, *flags])
        print(f"| {name} | {statistics.median(times):.1f} | {min(times):.1f} | {args.runs} | {load:.1f} | "
              f"{machine} | `{command}` |")  # fmt: skip


if __name__ == "__main__":
    main()
