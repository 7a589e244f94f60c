"""`rlsmoke run --repeat K`: every seed is its own record and is gated; per gate the worst seed stands
for the run (a failing one, else the smallest margin; NaN or missing is the worst)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.metrics import seed_records, update_summary
from rlsmoke.runkey import RunKey
from rlsmoke.thresholds import GateResult, Verdict, aligned, lookup_gates


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
            badness = [(r.passed, r.margin if math.isfinite(r.margin) else -math.inf) for r in per_seed]
            i = min(range(len(per_seed)), key=badness.__getitem__)
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
        return dataclasses.replace(self.verdicts[0], results=tuple(results))

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


def gate_run(out: Path) -> tuple[Verdict, SeedVerdicts]:
    """The thresholds' verdict on a finished run folder, written into its summary.json."""
    records = seed_records(out)
    try:
        gates = lookup_gates(RunKey.from_summary(records[0].meta))
    except RlsmokeError as exc:
        # A new device or dtype has no thresholds yet: keep what calibration needs, then say so.
        values = [{k: rec.value(k) for k in rec.keys()} for rec in records]
        update_summary(out, ({"metrics": values[0]} if len(records) == 1 else {"per_repeat": values})
                       | {"gates": [], "verdict": "FAIL", "error": exc.one_line()})  # fmt: skip
        raise
    first = int(str(records[0].meta.get("seed", 0)))
    seeds = SeedVerdicts(tuple(range(first, first + len(records))), tuple(map(gates.check, records)))
    verdict = seeds.verdicts[0] if len(records) == 1 else seeds.worst()
    fields = verdict.summary_fields()  # --repeat K: each gate's worst seed
    if len(records) > 1:
        gate_rows: list[dict] = fields["gates"]  # type: ignore[assignment]  # summary_fields' own list
        for gate_json, (_, seed, failing) in zip(gate_rows, seeds.per_gate(), strict=True):
            gate_json |= {"seed": seed, "failing_seeds": failing}
        fields |= {"seeds": list(seeds.seeds), "failed_seeds": seeds.failed_seeds()}
        fields["per_repeat"] = [
            {g.summary_key: rec.value(g.metric, g.reduce) for g in gates} for rec in records
        ]
        fields["per_repeat_verdict"] = ["PASS" if v.passed else "FAIL" for v in seeds.verdicts]
    update_summary(out, fields)
    return verdict, seeds
