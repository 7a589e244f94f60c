"""Case runs started ahead of their tests, on the cores a serial session leaves idle.

A serial session on a CPU host runs one tiny case at a time, on one core, while the others wait. A
test that takes its run from the `case_record` fixture declares the run as data (a `CaseRun`
parameter, or its module's CASE), so the plugin can start it before the test's turn: while one test
runs, the next declared runs start on the spare cores, each in the folder the test's own `artifacts`
will be. When its turn comes, the test claims its run only if it would launch the very same one now
(argv and environment); otherwise the early run is stopped and the test launches its own.

Only one-process CPU runs of the built-in engine go ahead (more ranks would take the core the
foreground test needs), never a test that will be skipped, and never under xdist, whose workers
share the cores out already (`platforms.share_cores`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence

from rlsmoke.selection import effective_case
from rlsmoke.suite import CaseRun, PendingCase

MAX_WAITING = 16  # finished runs whose test has not come yet (a bound on work an early end would waste)
PHASE_VARS = frozenset({"PYTEST_CURRENT_TEST"})  # pytest sets it anew in each phase of every test


def declared_run(item) -> CaseRun | None:
    """The run a test takes from `case_record`: its parameter, else its module's CASE."""
    if "case_record" not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "case_record" in callspec.params:
        spec = callspec.params["case_record"]
    else:
        case = getattr(getattr(item, "module", None), "CASE", None)
        spec = CaseRun(case) if case is not None else None
    return spec if isinstance(spec, CaseRun) else None


class RunAhead:
    """Starts the declared runs of later tests, `slots` at a time, and hands each to its test."""

    def __init__(self, items: Sequence, slots: int, artifacts_for: Callable, will_skip: Callable[[object], bool],
                 num_gpus: int | None = None):  # fmt: skip
        self.items = list(items)
        self.slots = slots
        self._artifacts_for = artifacts_for  # item -> the Artifacts its `artifacts` fixture will give
        self._will_skip = will_skip
        self._num_gpus = num_gpus
        self._index = {item.nodeid: i for i, item in enumerate(self.items)}
        self._next = 0  # items before this one were looked at already
        self.started: dict[str, tuple[CaseRun, PendingCase]] = {}  # nodeid -> its run, until claimed
        self._environ = dict(os.environ)
        self.claimed = 0

    def goes_ahead(self, item) -> CaseRun | None:
        """The item's declared run when it may start early: one CPU process of the built-in engine."""
        spec = declared_run(item)
        if spec is None or self._will_skip(item):
            return None
        case = effective_case(spec.case, self._num_gpus)
        if case.platform != "cpu" or case.num_gpus != 1 or case.mode == "async":
            return None
        return spec

    def owns(self, nodeid: str) -> bool:
        """Whether the item's folder holds a run started ahead (its `artifacts` must not empty it)."""
        return nodeid in self.started

    def between_tests(self, item) -> None:
        """Called as `item`'s setup begins: the environment no test has changed yet, which runs
        started later, inside a test, start from."""
        self._environ = dict(os.environ)
        self.advance(item)

    def advance(self, current) -> None:
        """Start runs of the items after `current` while a slot is free."""
        position = self._index.get(current.nodeid)
        if position is None or self.slots <= 0:
            return
        self._next = max(self._next, position + 1)
        while self._next < len(self.items):
            running = sum(not pending.done() for _, pending in self.started.values())
            if running >= self.slots or len(self.started) >= MAX_WAITING + self.slots:
                return
            item = self.items[self._next]
            spec = self.goes_ahead(item)
            if spec is None:
                self._next += 1
                continue
            art = self._artifacts_for(item)
            if art.warm is not None and not art.warm.ready():  # it still imports: the test in front must not wait
                return
            self._next += 1
            shutil.rmtree(art.path, ignore_errors=True)  # as the fixture would: no stale summary is read
            try:
                self.started[item.nodeid] = (spec, spec.start(art, self._environ))
            except Exception:  # a refusal, a corrupt checkpoint: the test meets it again, in its own report
                shutil.rmtree(art.path, ignore_errors=True)

    def claim(self, item, spec: CaseRun, art) -> tuple[PendingCase, object] | None:
        """The item's run if one went ahead and is the one `spec` would launch now under `art`, with
        the Artifacts its record is to be kept with."""
        entry = self.started.pop(item.nodeid, None)
        if entry is None:
            return None
        started_spec, pending = entry
        planned = spec.plan(art)
        changed = difference(planned, pending.launch) if started_spec == spec else "the declared run"
        if changed:
            pending.stop()
            shutil.rmtree(art.path, ignore_errors=True)
            art.path.mkdir(parents=True)
            (art.path / "pytest-run.log").write_text(f"rlsmoke: the run started ahead had another {changed}; "
                                                     "stopped it and launched this one\n")  # fmt: skip
            return None
        self.claimed += 1
        return pending, planned.art

    def stop(self) -> None:
        """Stop the runs no test claimed (the session ended early) and remove their folders."""
        for _, pending in self.started.values():
            pending.stop()
            shutil.rmtree(pending.launch.art.path, ignore_errors=True)
        self.started.clear()


def difference(planned, launched) -> str:
    """What differs between two launches ("" when they are the same run): the argv, or the variables."""
    if planned.argv != launched.argv:
        return "argv"
    names = {k for k in planned.env.keys() | launched.env.keys() if planned.env.get(k) != launched.env.get(k)}
    return f"environment ({', '.join(sorted(names - PHASE_VARS))})" if names - PHASE_VARS else ""
