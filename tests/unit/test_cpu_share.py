"""Cores under pytest-xdist: each worker, and each engine rank under it, runs on its share, not on all.

W workers that each let torch use every core oversubscribe the CPU W times over (a 4.5 s fault twin
took 92-98 s under `-n 2` on 2 cores). The threads are read back from the processes themselves.
"""

import os

import pytest

from rlsmoke.platforms import detect

pytest_plugins = ["pytester"]

CORES = len(os.sched_getaffinity(0))
HOST = detect()
# torch is imported in the test, not at collection: every xdist worker collects, one runs it.
THREADS_TEST = """
import os

def test_threads():
    import torch

    print("THREADS", os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"), torch.get_num_threads())
"""


@pytest.fixture
def no_thread_vars(monkeypatch):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("workers", [2, 3])
def test_each_xdist_worker_gets_its_share_of_the_cores(pytester, no_thread_vars, workers):
    """On a GPU host (named, since this one may have none): a CPU host's share is the tiny one below."""
    pytest.importorskip("xdist")
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_threads=THREADS_TEST)
    gpu_platform = HOST.platform if HOST.platform != "cpu" else "nvidia"
    result = pytester.runpytest_subprocess(
        "-n", str(workers), "-rP", "--platform", gpu_platform, "--num-gpus", "0"
    )
    result.assert_outcomes(passed=1)
    share = max(1, CORES // workers)
    result.stdout.fnmatch_lines([f"*THREADS {share} {share} {share}*"])


@pytest.mark.skipif(HOST.platform != "cpu", reason="the tiny thread count is a CPU host's")
def test_on_a_cpu_host_a_serial_session_runs_the_tiny_thread_count_too(pytester, no_thread_vars):
    """Two threads on a tiny model spin-wait for each other whenever anything else holds a core."""
    from rlsmoke.pytest_plugin import TINY_THREADS

    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_threads=THREADS_TEST)
    result = pytester.runpytest_subprocess("-rP")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*THREADS {TINY_THREADS} {TINY_THREADS} {TINY_THREADS}*"])


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores: the user's count must differ from the share")
def test_a_thread_count_the_user_set_is_kept(pytester, no_thread_vars, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the share of 2 workers on 2 cores would be 1
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_threads=THREADS_TEST)
    result = pytester.runpytest_subprocess("-n", "2", "-rP")
    result.stdout.fnmatch_lines(["*THREADS 2 2 2*"])


def test_engine_ranks_split_the_runs_budget(monkeypatch):
    """`--num-gpus 2` on CPU: two gloo ranks, each on half of the run's threads (OMP_NUM_THREADS=6 -> 3)."""
    from rlsmoke.engine.config import RunConfig
    from rlsmoke.engine.model import checkpoint_dir, load_tokenizer
    from rlsmoke.engine.sharded import Sharded

    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    cfg = RunConfig(case="glm4.5-355b-a32b-4layer", tiny=True, num_gpus=2, n_prompts=2)
    ckpt = checkpoint_dir(cfg.case, tiny=True)
    tok = load_tokenizer(ckpt)
    ranks = Sharded(cfg, ckpt, tok.eos_token_id, tok.eos_token_id)
    try:
        assert [r["threads"] for r in ranks.where["ranks"]] == [3, 3]
    finally:
        ranks.close()
