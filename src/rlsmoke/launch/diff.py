"""`rlsmoke plan --diff`: seed 004's NVIDIA -> ROCm table, or what one target changes against another,
generated from two renders."""

from __future__ import annotations

import dataclasses

from rlsmoke.launch.miles import GROUP_ORDER, flag_values


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


def diff_platforms(case, other_platform: str) -> str:
    there = dataclasses.replace(case, platform=other_platform, mode=None)
    return _table(diff_rows(case.plan(), there.plan()), (case.platform, other_platform))


def diff_targets(case, other_target: str) -> str:
    """What changes in the launch when it is rendered for `other_target` instead of the case's target."""
    there = dataclasses.replace(case, target=other_target)
    return _table(diff_rows(case.plan(), there.plan()), (case.target, other_target))


def _table(rows: list[tuple[str, str, str, str]], names: tuple[str, str]) -> str:
    head = ("group", "flag / env", *names)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    fmt = " | ".join(f"{{:{w}}}" for w in widths)
    lines = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)
