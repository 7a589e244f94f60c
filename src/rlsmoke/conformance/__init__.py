"""Conformance: the real Miles, SGLang and megatron-core validators on a rendered plan, each in its own
venv; the plan is valid when every parser of its target's dialect accepts it. No torch here."""

from __future__ import annotations

from rlsmoke.conformance.runner import check_plans
from rlsmoke.conformance.verdict import Verdict

__all__ = ["Verdict", "check_plan", "check_plans", "format_verdicts", "real_verdict"]


def check_plan(plan_json: dict) -> list[Verdict]:
    """The verdict of each real parser (Miles 0.0.2, SGLang 0.5.23, megatron-core 0.16.1) on one plan."""
    return check_plans([plan_json])[0]


def real_verdict(verdicts: list[Verdict]) -> bool | None:
    """True/False from the parsers that apply to the plan's target; None if one of them did not run."""
    relevant = [v for v in verdicts if v.applies]
    if any(v.accepted is None for v in relevant):
        return None
    return all(v.accepted for v in relevant)


def format_verdicts(verdicts: list[Verdict]) -> str:
    """The `--check` report: one line per parser, then the overall verdict."""
    lines = [v.one_line() for v in verdicts]
    overall = real_verdict(verdicts)
    summary = {True: "accepted by every real parser of the target",
               False: "REJECTED by a real parser of the target",
               None: "incomplete: a parser of the target did not run"}[overall]  # fmt: skip
    return "\n".join([*lines, f"overall  {summary}"])
