"""The memory estimate against the measured peak, per phase: one markdown row per run folder's summary.json.

    python bench/memory_table.py ARTIFACTS_DIR... [--estimate CASE@GPUS ...]

Each cell is `estimate / measured` in GiB per GPU. The estimate is recomputed by this checkout's
`rlsmoke.memory` from what summary.json records (case, GPU count, mode, dtypes, offload) and the
suite's GPU batch (`resolve.plan_for`: seed 004's 8 prompts x 8 samples x 100 response tokens), not
read from the summary, which holds the estimate of the code that ran. The measured figure is
`torch.cuda.max_memory_allocated` per phase window, the max over ranks. The peak error is
(estimate - measured) / measured over all phases. `--estimate CASE@GPUS` adds a row with no run behind it.

Summaries written before `memory.meter` existed counted the move that brings the train weights back
for scoring in the rollout window; their rollout cell is marked and a note compares it with that move.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rlsmoke import memory, resolve
from rlsmoke.cases import Case

PHASES = memory.PHASES


def _plan(case: Case, mem: dict, dtype: dict) -> memory.Plan:
    plan = resolve.plan_for(case, offload=mem.get("offload"))
    return dataclasses.replace(plan, train_dtype=dtype.get("train", plan.train_dtype),
                               rollout_dtype=dtype.get("rollout", plan.rollout_dtype),
                               compute_dtype=dtype.get("compute", plan.compute_dtype))  # fmt: skip


def _gib(b: int) -> float:
    return b / memory.GIB


def _row(
    case: Case,
    est: memory.Estimate,
    measured: dict[str, float] | None,
    old_meter: bool,
    offload: bool,
    inject: str = "none",
):
    cells, notes = [], []
    for phase in PHASES:
        e = _gib(est.phases[phase])
        m = (measured or {}).get(phase)
        mark = "*" if old_meter and phase == "rollout" and m is not None else ""
        cells.append(f"{e:.1f} / {m:.1f}{mark}" if m is not None else f"{e:.1f} / -")
    if measured:
        peak_phase = max(measured, key=measured.get)
        peak = measured[peak_phase]
        err = f"{(_gib(est.peak) - peak) / peak:+.1%}"
        shown = f"{peak:.1f} ({peak_phase})"
        if old_meter and "rollout" in measured:
            t = est.terms["train"]
            back = t.get("master", 0) + t.get("compute copy", 0)
            window = max(est.phases["rollout"], back)
            notes.append(f"{case.name} ({case.num_gpus} GPU): rollout window as metered then = max(rollout "
                         f"{_gib(est.phases['rollout']):.2f}, train weights coming back {_gib(back):.2f}) = "
                         f"{_gib(window):.2f} GiB vs {measured['rollout']:.2f} measured "
                         f"({(_gib(window) - measured['rollout']) / measured['rollout']:+.1%})")  # fmt: skip
    else:
        shown, err = "not measured", "-"
    label = case.name if inject in ("none", "", None) else f"{case.name}, inject {inject}"
    line = (
        f"| {label} | {case.num_gpus} | {'on' if offload else 'off'} | "
        + " | ".join(cells)
        + f" | {_gib(est.peak):.1f} ({est.peak_phase}) | {shown} | {err} |"
    )
    return line, notes


def rows(folders: list[Path], extra: list[str] = ()) -> list[str]:
    out = ["| case | GPUs | offload | load | rollout | train | sync | estimated peak (phase) | measured peak (phase) "
           "| peak error |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    notes: list[str] = []
    for folder in folders:
        for path in sorted(folder.rglob("summary.json")):
            s = json.loads(path.read_text())
            mem = s.get("memory")
            if not mem or s.get("width") != "full":
                continue
            gpus = int(mem.get("world") or 1)  # the summary's num_gpus is the key's count: "*" for one device
            case = Case(s["case"], platform=s["platform"], num_gpus=gpus, mode=s.get("mode"))
            est = memory.estimate(case.spec(), _plan(case, mem, s.get("dtype") or {}))
            ranks = [p for p in mem.get("peak_gib_per_rank_by_phase") or [] if p]
            measured = {k: max(r.get(k, 0.0) for r in ranks) for k in PHASES if any(k in r for r in ranks)}
            line, more = _row(
                case,
                est,
                measured or None,
                "meter" not in mem,
                bool(mem.get("offload")),
                s.get("inject", "none"),
            )
            out.append(line)
            notes += [n for n in more if n not in notes]
    for item in extra:
        name, _, gpus = item.partition("@")
        case = Case(name, platform="nvidia", num_gpus=int(gpus or 1))
        plan = resolve.plan_for(case)
        out.append(_row(case, memory.estimate(case.spec(), plan), None, False, plan.offload)[0])
    if notes:
        out += ["", "\\* measured before `memory.meter`: the rollout window also held the return of the train "
                "weights for scoring.", ""] + [f"- {n}" for n in notes]  # fmt: skip
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", type=Path, default=[Path(".")])
    ap.add_argument(
        "--estimate",
        action="append",
        default=[],
        metavar="CASE@GPUS",
        help="a row with the estimate only (no run measured it)",
    )
    args = ap.parse_args()
    print("\n".join(rows(args.folders, args.estimate)))
