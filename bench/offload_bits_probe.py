"""Whether a two-rank CPU run under gloo gives the same step twice, with and without the offload, at
this host's thread count (tests/unit/test_engine_offload.py compares one of each).
    python3 bench/offload_bits_probe.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

import torch  # noqa: E402
from test_engine_offload import CASE, phase_walk  # noqa: E402

from rlsmoke.engine.config import RunConfig  # noqa: E402
from rlsmoke.platforms import thread_budget  # noqa: E402


def main() -> None:  # the ranks' fork server re-imports this file: nothing runs at import
    cfg = RunConfig(case=CASE, tiny=True, num_gpus=2, n_prompts=2, offload=False)
    print(f"threads: budget {thread_budget()}, torch {torch.get_num_threads()}", flush=True)
    steps = {}
    for name, offload in (("plain", False), ("plain again", False), ("offload", True)):
        steps[name] = phase_walk(cfg.replace(offload=offload))[0]
        print(name, "equals plain:", steps[name] == steps["plain"], flush=True)
        if steps[name] != steps["plain"]:
            for a, b in zip(steps[name], steps["plain"], strict=True):
                print("  ", {k: (a[k], b[k]) for k in a if a[k] != b[k]}, flush=True)


if __name__ == "__main__":
    main()
