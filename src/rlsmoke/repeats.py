"""`rlsmoke run --repeat K`: every seed is judged by the gates, and the run passes only if each does.

Each seed is its own record: merging the seeds' lines by (kind, index) would let the last seed
overwrite the others. Per gate the worst seed stands for the run: a failing seed before a passing
one, then the smallest margin (a NaN or a missing value counts as the worst).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rlsmoke.thresholds import GateResult, Verdict, aligned


def _badness(result: GateResult) -> tuple[bool, float]:
    margin = result.margin if math.isfinite(result.margin) else -math.inf
    return result.passed, margin


@dataclass(frozen=True)
class SeedVerdicts:
    seeds: tuple[int, ...]
    verdicts: tuple[Verdict, ...]  # one per seed, the same gates in the same order

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def failed_seeds(self) -> list[int]:
        return [s for s, v in zip(self.seeds, self.verdicts, strict=True) if not v.passed]

    def per_gate(self) -> list[tuple[GateResult, int, list[int]]]:
        """For each gate: its worst seed's result, that seed, and every seed that failed it."""
        rows = []
        for per_seed in zip(*(v.results for v in self.verdicts), strict=True):
            i = min(range(len(per_seed)), key=lambda k: _badness(per_seed[k]))
            failing = [s for s, r in zip(self.seeds, per_seed, strict=True) if not r.passed]
            rows.append((per_seed[i], self.seeds[i], failing))
        return rows

    def worst(self) -> Verdict:
        """One verdict of each gate's worst seed; it passes only if every seed passed every gate."""
        results = []
        for result, seed, failing in self.per_gate():
            note = f"seed {seed}, the worst of {len(self.seeds)}"
            if failing:
                note += f"; failing seeds: {', '.join(map(str, failing))}"
            results.append(dataclasses.replace(result, note="; ".join(filter(None, [result.note, note]))))
        first = self.verdicts[0]
        return Verdict(tuple(results), first.artifacts, first.key, first.source)

    def table(self) -> str:
        """Each gate's worst seed: its value, bound and margin, which seed it is, and every failing seed."""
        rows = [("gate", "metric", "worst", "seed", "bound", "margin", "")]
        for r, seed, failing in self.per_gate():
            name, metric, value, bound, margin = r.cells()
            result = "PASS" if r.passed else f"FAIL (seed {', '.join(map(str, failing))})"
            rows.append((name, metric, value, str(seed), bound, margin, result))
        seeds = f"{len(self.seeds)} seeds ({', '.join(map(str, self.seeds))})"
        failed = self.failed_seeds()
        verdict = f"verdict: {'PASS' if self.passed else 'FAIL'} over {seeds}"
        if failed:
            verdict += f"; failed: seed {', '.join(map(str, failed))}"
        return "\n".join([f"each gate's worst of {seeds}:", *aligned(rows), verdict])
