"""`rlsmoke plan --diff`: seed 004's NVIDIA -> ROCm table, or what one target changes against another,
generated from two renders."""

from __future__ import annotations

import dataclasses

from rlsmoke.launch.miles import GROUP_ORDER, flag_values


def _by_flag(plan) -> dict[str, tuple[str, str]]:
    out = {}
    for group in GROUP_ORDER:
        for flag, values in flag_values(plan.launch.groups.get(group, [])):
            out[flag] = (group, " ".join(values) if values else "(set)")
    return out


def diff_rows(
    case, other_platform: str | None = None, *, other_target: str | None = None
) -> list[tuple[str, str, str, str]]:
    """(group, flag or env var, here, there) for everything that differs on the other platform or target."""
    here = case.plan()
    if other_target is not None:
        there = dataclasses.replace(case, target=other_target).plan()
    else:
        there = dataclasses.replace(case, platform=other_platform, mode=None).plan()
    a, b = _by_flag(here), _by_flag(there)
    rows = []
    for flag in list(a) + [f for f in b if f not in a]:
        va, vb = a.get(flag, ("", "—"))[1], b.get(flag, ("", "—"))[1]
        if va != vb:
            rows.append((a.get(flag, b.get(flag))[0], flag, va, vb))
    ea, eb = here.launch.env, there.launch.env
    for var in list(ea) + [v for v in eb if v not in ea]:
        if ea.get(var) != eb.get(var):
            rows.append(("env", var, ea.get(var, "—"), eb.get(var, "—")))
    if here.launch.script != there.launch.script:
        rows.insert(0, ("mode", "script", here.launch.script, there.launch.script))
    return rows


def diff_platforms(case, other_platform: str) -> str:
    return _table(diff_rows(case, other_platform), (case.platform, other_platform))


def diff_targets(case, other_target: str) -> str:
    """What changes in the launch when it is rendered for `other_target` instead of the case's target."""
    return _table(diff_rows(case, other_target=other_target), (case.target, other_target))


def _table(rows: list[tuple[str, str, str, str]], names: tuple[str, str]) -> str:
    head = ("group", "flag / env", *names)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    fmt = " | ".join(f"{{:{w}}}" for w in widths)
    lines = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)
