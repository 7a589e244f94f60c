"""Keeps the pytest process fit to fork CPU ranks from (`rlsmoke.engine.procs.fork_is_safe`).

A process group, or the threads torch leaves after one, turns every later rank of the session into
a fork-server start (seconds each). A test that needs a group runs it in a rank
(`engine.megatron.dist.run_ranks(fn, Parallel())` for world size 1); one that leaves it here fails.
"""

import sys

import pytest


def _leftovers() -> list[str]:
    if "torch" not in sys.modules:
        return []
    from rlsmoke.engine.procs import distributed_leftovers

    return distributed_leftovers()


@pytest.fixture(autouse=True)
def _no_process_group_left_in_the_pytest_process():
    before = _leftovers()
    yield
    left = [what for what in _leftovers() if what not in before]  # the test that left it, not every later one
    assert not left, (f"this test left {', '.join(left)} in the pytest process; run what needs a group in a "
                      "rank: run_ranks(fn, Parallel())")  # fmt: skip
