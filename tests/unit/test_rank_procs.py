"""Rank processes: what a rank returns reaches its driver whole, a failing rank fails the call, and a
rank forked from the fork server starts as a spawned one would (the driver's environment and output).

The ranks are real processes under real gloo groups; nothing here needs a checkpoint.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from rlsmoke.bridge.convert import Parallel
from rlsmoke.engine.megatron import available

needs_mcore = pytest.mark.skipif(
    not available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"
)
UNPICKLE_DELAY_S = 1.0


class ReadSlowly:
    """Unpickles only after a pause: by then a rank that returned it has exited."""

    def __reduce__(self):
        return _read_slowly, ()


def _read_slowly():
    time.sleep(UNPICKLE_DELAY_S)
    return ReadSlowly()


def _tensors_then_exit(rank, par):
    return ReadSlowly(), torch.full((4, 3), float(rank)), {"state": torch.arange(6).view(2, 3) + rank}


def _fail_or_wait(rank, par, failing):
    """Rank `failing` raises; the others wait as in a collective whose peer never comes."""
    import torch.distributed as dist

    if rank == failing:
        raise ValueError(f"rank {rank} refuses")
    if failing >= 0:
        time.sleep(600)
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _die(rank, par):
    if rank == 1:
        os._exit(7)
    return rank


@needs_mcore
def test_tensors_a_rank_returns_outlive_the_rank():
    """Received after the ranks have exited: torch's shared-memory handles would point at nothing."""
    from megatron_ranks import run_ranks

    results = run_ranks(_tensors_then_exit, Parallel(tp=2))
    for rank, (_, filled, state) in enumerate(results):
        assert torch.equal(filled, torch.full((4, 3), float(rank)))
        assert torch.equal(state["state"], torch.arange(6).view(2, 3) + rank)


@needs_mcore
def test_a_failing_rank_fails_the_call_and_stops_the_rank_waiting_for_it(monkeypatch):
    import megatron_ranks as dist

    # how long the driver waits for the others once one failed: rank 0 sleeps on, so all of it is waited out
    monkeypatch.setattr(dist, "RANK_GRACE_S", 0.5)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as failed:
        dist.run_ranks(_fail_or_wait, Parallel(tp=2), 1)
    assert time.monotonic() - start < 60, "the driver waited on a rank stuck in a collective"
    assert "ValueError: rank 1 refuses" in str(failed.value)
    assert "rank 0: stopped after another rank failed" in str(failed.value)
    assert dist.run_ranks(_fail_or_wait, Parallel(tp=2), -1) == [2.0, 2.0]  # the twin: no rank fails


@needs_mcore
def test_a_rank_that_dies_is_named_with_its_exit_code():
    from megatron_ranks import run_ranks

    with pytest.raises(RuntimeError, match=r"rank 1: died \(exit code 7\)"):
        run_ranks(_die, Parallel(tp=2))


def _frozen_objects(rank, par):
    import gc

    return gc.get_freeze_count()


@needs_mcore
def test_forked_ranks_find_the_driver_s_objects_frozen_and_the_driver_keeps_its_collector():
    """A rank's collections skip what it inherited from the driver (and so never copy those pages)."""
    import gc

    from megatron_ranks import run_ranks

    from rlsmoke.engine.procs import fork_is_safe

    if not fork_is_safe():  # under xdist: ranks start from the fork server, whose heap is its own
        pytest.skip("ranks start from the fork server in this process")
    frozen = run_ranks(_frozen_objects, Parallel(tp=2))
    assert min(frozen) > 100_000, frozen  # torch's and transformers' modules, at least
    assert gc.get_freeze_count() == 0  # the driver's collector has its objects back


def _report(conn):
    conn.send((os.environ.get("RLSMOKE_RANK_PROBE"), "torch" in sys.modules))
    print(f"rank says {os.environ.get('RLSMOKE_RANK_PROBE')}", flush=True)
    conn.close()


def test_a_rank_starts_with_the_driver_s_environment_and_output_and_torch_already_imported(
        tmp_path, monkeypatch, capfd):  # fmt: skip
    from rlsmoke.engine.procs import rank_context

    ctx = rank_context()
    for probe in ("first", "second"):  # the second rank forks from a server started before the change
        monkeypatch.setenv("RLSMOKE_RANK_PROBE", probe)
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_report, args=(writer,))
        proc.start()
        writer.close()
        env, torch_loaded = reader.recv()
        proc.join(30)
        assert (env, torch_loaded, proc.exitcode) == (probe, True, 0)
        assert f"rank says {probe}" in capfd.readouterr().out


def _report_asks(conn, asked):
    conn.send(list(asked))
    conn.close()


@pytest.mark.parametrize("renew", [True, False], ids=["forked-rank", "twin-no-renewal"])
def test_a_forked_rank_asks_for_torch_s_pool_on_its_one_thread_before_its_target(monkeypatch, renew):
    """After a fork torch replaces the inherited pool on the first thread that asks for it; two of
    transformers' loader threads asking at once can find none ("Invalid thread pool!";
    bench/fork_pool_race.py measures how often). So a rank asks once, on its one thread, before its target
    runs. Twin: without the renewal no thread has asked when the target starts."""
    import threading

    from procs import in_a_child

    from rlsmoke.engine import procs

    asked: list[str] = []  # the fork's copy is the child's own: the target sends it back
    set_num_threads = torch.set_num_threads

    def recorded(n):
        asked.append(threading.current_thread().name)
        set_num_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", recorded)
    if not renew:
        monkeypatch.setattr(procs, "renew_thread_pool", lambda: None)
    assert in_a_child(procs.ForkContext(), _report_asks, asked) == (["MainThread"] if renew else [])
