"""Keeps the pytest process fit to fork CPU ranks from (`rlsmoke.engine.procs.fork_is_safe`).

A process group, or the threads torch leaves after one, turns every later rank of the session into
a fork-server start (seconds each). A test that needs a group runs it in a rank
(`engine.megatron.dist.run_ranks(fn, Parallel())` for world size 1); one that leaves it here fails.
"""

import pytest

from rlsmoke.engine.procs import distributed_leftovers  # torch only if this process imported it


@pytest.fixture(autouse=True)
def _no_process_group_left_in_the_pytest_process():
    before = distributed_leftovers()
    yield
    left = [what for what in distributed_leftovers() if what not in before]  # that test's, not every later one's
    assert not left, (f"this test left {', '.join(left)} in the pytest process; run what needs a group in a "
                      "rank: run_ranks(fn, Parallel())")  # fmt: skip
