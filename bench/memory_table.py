"""The memory estimate against the measured peak: one markdown row per run folder's summary.json.

    python bench/memory_table.py ARTIFACTS_DIR...   # folders are searched for summary.json

The peak is `torch.cuda.max_memory_allocated` per rank (the max over ranks and phases); the error is
(estimate - peak) / peak. Runs without a measured peak (CPU, Ray async) are listed without one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(folders: list[Path]) -> list[str]:
    out = ["| case | GPUs | offload | estimate GiB (phase) | measured peak GiB (phase) | error |", "|---|---|---|---|---|---|"]
    for folder in folders:
        for path in sorted(folder.rglob("summary.json")):
            s = json.loads(path.read_text())
            mem = s.get("memory")
            if not mem or s.get("width") != "full":
                continue
            est = dict(mem["estimate_gib_per_gpu"])
            est_peak = est.pop("peak")
            est_phase = max(est, key=est.get)
            by_phase = [p for p in mem.get("peak_gib_per_rank_by_phase") or [] if p]
            if by_phase:
                measured = max(max(p.values()) for p in by_phase)
                phase = next(k for p in by_phase for k, v in p.items() if v == measured)
                err = f"{(est_peak - measured) / measured:+.1%}"
                shown = f"{measured:.1f} ({phase})"
            else:
                shown, err = "not measured", "-"
            out.append(f"| {s['case']} | {mem.get('world', s.get('num_gpus'))} | {'on' if mem.get('offload') else 'off'} "
                       f"| {est_peak:.1f} ({est_phase}) | {shown} | {err} |")  # fmt: skip
    return out


if __name__ == "__main__":
    print("\n".join(rows([Path(a) for a in sys.argv[1:]] or [Path(".")])))
