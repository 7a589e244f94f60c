"""`rlsmoke plan --diff`: seed 004's NVIDIA -> ROCm table, or what one target changes against another,
generated from two renders."""

from __future__ import annotations

import dataclasses

from rlsmoke.launch.miles import GROUP_ORDER, flag_values
from rlsmoke.targets import TARGETS


def _entries(plan) -> dict[str, tuple[str, str]]:
    """{flag or env var: (its group, its value)} of the plan's launch."""
    out = {}
    for group in GROUP_ORDER:
        for flag, values in flag_values(plan.launch.groups.get(group, [])):
            out[flag] = (group, " ".join(values) if values else "(set)")
    return out | {var: ("env", value) for var, value in plan.launch.env.items()}


def diff_rows(here, there) -> list[tuple[str, str, str, str]]:
    """(group, flag or env var, here, there) for everything that differs between two plans."""
    a, b = _entries(here), _entries(there)
    missing = ("", "—")
    rows = []
    for key in [*a, *(k for k in b if k not in a)]:
        (group_a, va), (group_b, vb) = a.get(key, missing), b.get(key, missing)
        if va != vb:
            rows.append((group_a or group_b, key, va, vb))
    rows.sort(key=lambda row: row[0] == "env")  # the flags, then the env
    if here.launch.script != there.launch.script:
        rows.insert(0, ("mode", "script", here.launch.script, there.launch.script))
    return rows


def diff(case, other: str) -> str:
    """What changes in the launch when it is rendered for target `other` instead of the case's target, or on
    platform `other` (in its default mode), as a table."""
    if other in TARGETS:
        there, here = dataclasses.replace(case, target=other), case.target
    else:
        there, here = dataclasses.replace(case, platform=other, mode=None), case.platform
    rows = diff_rows(case.plan(), there.plan())
    head = ("group", "flag / env", here, other)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    fmt = " | ".join(f"{{:{w}}}" for w in widths)
    lines = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    return "\n".join(lines + [fmt.format(*r) for r in rows])
