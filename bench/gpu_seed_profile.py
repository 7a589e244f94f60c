"""Where a further seed's seconds go, kernel by kernel: one colocated run (`--repeat`, default 3) in this
process, its last seed under torch.profiler, each engine phase a labelled range. The question it answers
for a launch-bound step: how much of a phase's wall time the GPU was busy.

    python bench/gpu_seed_profile.py glm5-744b-a40b-4layer-1gpu --trainer megatron --out OUT_DIR

OUT_DIR/profile.txt: each phase's wall against its kernels' time, then the ops by host time and by device
time; OUT_DIR/run/: the run's own records.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rlsmoke.cases import Case
from rlsmoke.engine import run as engine_run
from rlsmoke.engine import timing
from rlsmoke.resolve import Session, resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--platform", default="nvidia")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--trainer", default="fsdp")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    case = Case(args.case, platform=args.platform, tiny=args.tiny)
    cfg = resolve(case, Session(trainer=args.trainer, repeat=args.repeat))
    seen: list[int] = []
    one_run, clock_call = engine_run.one_run, timing.PhaseClock.__call__

    def labelled(self, phase, call, *a, **kw):  # each phase a range in the profile
        with record_function(f"phase {phase}"):
            return clock_call(self, phase, call, *a, **kw)

    def last_seed_profiled(*a, **kw):
        seen.append(1)
        if len(seen) < args.repeat:
            return one_run(*a, **kw)
        gpu = torch.cuda.is_available()
        with profile(activities=[ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu) as prof:
            lines = one_run(*a, **kw)
            if gpu:
                torch.cuda.synchronize()
        write(prof, args.out / "profile.txt")
        return lines

    timing.PhaseClock.__call__ = labelled
    engine_run.one_run = last_seed_profiled
    engine_run.execute(cfg, args.out / "run", repeat=args.repeat)


def write(prof, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    events = prof.key_averages()
    rows = ["phase: wall s (host range) | kernels' time inside it s (device)"]
    for e in events:
        if e.key.startswith("phase "):
            rows.append(f"{e.key[6:]}: {e.cpu_time_total / 1e6:.3f} | {e.device_time_total / 1e6:.3f}")
    kernels = sum(e.self_device_time_total for e in events) / 1e6
    rows.append(f"all kernels of the seed: {kernels:.3f} s")
    for key in ("self_cpu_time_total", "self_device_time_total"):
        rows += ["", f"by {key}:", events.table(sort_by=key, row_limit=35, max_name_column_width=70)]
    path.write_text("\n".join(rows) + "\n")
    print("\n".join(rows[:8]))


if __name__ == "__main__":
    main()
