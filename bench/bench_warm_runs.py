"""Wall time of one tiny CPU `rlsmoke run`, started fresh vs forked from the warm server, alternated.

    python bench/bench_warm_runs.py [--rounds 3] [--case glm5-744b-a40b-4layer] [-- RUN_ARGS ...]

Each round runs the same `python -m rlsmoke.cli run CASE --platform cpu --tiny --records-only` twice
through `launch.runner`: once spawned (a fresh interpreter, as a user's shell starts it), once forked
from a `launch.warm.WarmServer` started before the first round (its start-up is printed apart). The
rounds alternate, so a shared machine's load falls on both; ratios within a round are what compares.
Every run's metrics.jsonl must be the same bits, or the benchmark fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from rlsmoke.launch import runner
from rlsmoke.launch.warm import WarmServer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", default="glm5-744b-a40b-4layer")
    parser.add_argument("run_args", nargs="*", help="more `rlsmoke run` flags (after --)")
    args = parser.parse_args()
    env = runner.clean_env()
    work = Path(tempfile.mkdtemp(prefix="rlsmoke-bench-warm-"))
    print(f"{platform.node()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, {time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
    started = time.perf_counter()
    server = WarmServer.start(env)
    server._wait_ready()
    print(f"warm server ready after {time.perf_counter() - started:.1f} s (paid once per session)")
    metrics = set()
    try:
        for r in range(args.rounds):
            seconds = {}
            for kind, warm in (("fresh", None), ("forked", server)):
                out = work / f"{kind}-{r}"
                argv = [sys.executable, "-m", "rlsmoke.cli", "run", args.case, "--platform", "cpu", "--tiny",
                        "--records-only", "--out", str(out), *args.run_args]  # fmt: skip
                result = runner.run(argv, env=env, log=work / f"{kind}-{r}.log", timeout=600, warm=warm)
                if not result.ok:
                    print(f"{kind} run failed: see {result.log}")
                    return 1
                seconds[kind] = result.seconds
                metrics.add((out / "metrics.jsonl").read_text())
            print(f"round {r}: fresh {seconds['fresh']:.2f} s, forked {seconds['forked']:.2f} s, "
                  f"forked/fresh {seconds['forked'] / seconds['fresh']:.2f}, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        server.stop()
    if len(metrics) != 1:
        print(f"the runs' metrics differ: {len(metrics)} distinct metrics.jsonl")
        return 1
    print("every run wrote the same metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
