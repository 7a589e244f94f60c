"""Gating a suite run: `gates_for(case).check(record)` fails with every mismatch of the run key's
thresholds (`rlsmoke.thresholds`), then of the history band (`rlsmoke.history`)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from rlsmoke import history, metrics, report, thresholds
from rlsmoke.artifacts import Artifacts
from rlsmoke.runkey import RunKey


class GateFailure(AssertionError):
    """One or more gates failed; the message lists each with value, bound, margin, provenance, artifacts."""


class HistoryBandWarning(UserWarning):
    """A history band failed in shadow mode (`--history-shadow`): shown in pytest's summary, not gating."""


@dataclass(frozen=True)
class CaseGates:
    case: object
    artifacts: Artifacts | None = None

    def verdict(self, record, artifacts: Artifacts | None = None):
        """The thresholds' verdict, without raising; the device is the summary's, else the session's."""
        session = artifacts or self.artifacts or getattr(record, "ran_with", None)
        key = RunKey.from_summary(record.meta, case=self.case.name, platform=self.case.platform,
                                  device=session.host.device if session is not None else None)  # fmt: skip
        return thresholds.lookup_gates(key).check(record)

    def check(self, record, artifacts: Artifacts | None = None):
        """Apply the thresholds and the history band; raise `GateFailure` listing every failure."""
        # the Artifacts a suite run returned with its record (`CaseRecord`), else a bare one for its folder
        folder = getattr(record, "artifacts", "")
        bare = Artifacts(Path(folder)) if folder else None
        art = artifacts or self.artifacts or getattr(record, "ran_with", None) or bare
        verdict = self.verdict(record, artifacts)
        bands = []
        if art is not None:
            if art.history is not None and not art.update_golden:
                bands = history.record_and_check(
                    art.history, record, verdict, commit=art.commit, trusted=art.trusted
                )
            metrics.update_summary(art.path, verdict.summary_fields())
            for r in verdict.results:
                art.record_property(f"gate:{r.gate.name}", "PASS" if r.passed else f"FAIL {r.line()}")
            for b in bands:
                shadow = "SHADOW " if art.history_shadow else ""
                art.record_property(f"band:{b.metric}", "PASS" if b.passed else f"{shadow}FAIL {b.line()}")
            report.write_run_summary(art.path, verdict, bands, shadow=art.history_shadow)
            if art.update_golden:
                path = report.write_threshold_candidate(art.path, record, verdict)
                art.record_property("threshold_candidate", str(path))
                return verdict  # recording, not gating: the candidate goes to review
        failed_bands = [b for b in bands if not b.passed]
        if failed_bands and art.history_shadow:  # bands come only with artifacts
            warnings.warn(HistoryBandWarning(history.report(failed_bands)), stacklevel=2)
            failed_bands = []
        failures = [] if verdict.passed else [verdict.report()]
        failures += [history.report(failed_bands)] if failed_bands else []
        if failures:
            raise GateFailure("\n".join(failures))
        return verdict


# The gates of a case: thresholds from fixtures/thresholds/ for the run's key, plus the history band.
gates_for = CaseGates
