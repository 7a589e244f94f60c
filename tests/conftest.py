"""Keeps the pytest process fit to fork CPU ranks from (`rlsmoke.engine.procs.fork_is_safe`), and
its environment as each test found it.

A process group, or the threads torch leaves after one, turns every later rank of the session into
a fork-server start (seconds each). A test that needs a group runs it in a rank
(`megatron_ranks.run_ranks(fn, Parallel())` for world size 1); one that leaves it here fails.

In-process runs set variables for their own process (Ray's driver: PYTHONBREAKPOINT, RAY_CLIENT_MODE;
the engine: CUBLAS_WORKSPACE_CONFIG, TOKENIZERS_PARALLELISM). Left in place, every later run of the
session would inherit them.
"""

import os

import pytest

from rlsmoke.engine.procs import LIVE_GROUP, distributed_leftovers  # torch only if this process imported it


@pytest.fixture(autouse=True)
def _no_process_group_left_in_the_pytest_process():
    before = distributed_leftovers()
    yield
    left = [
        what for what in distributed_leftovers() if what not in before
    ]  # that test's, not every later one's
    if (
        before
    ):  # a thread of what an earlier test left can start late (gloo's run loop, under load): that test's
        left = [what for what in left if what == LIVE_GROUP]
    assert not left, (f"this test left {', '.join(left)} in the pytest process; run what needs a group in a "
                      "rank: run_ranks(fn, Parallel())")  # fmt: skip


def _restore_environment():
    before = dict(os.environ)
    yield
    for name in [name for name in os.environ if name not in before]:
        del os.environ[name]
    for name, value in before.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


# A module's fixtures run in-process steps too: each module, then each test, is put back.
_environment_as_the_module_found_it = pytest.fixture(scope="module", autouse=True)(_restore_environment)
_environment_as_the_test_found_it = pytest.fixture(autouse=True)(_restore_environment)
