"""Rank processes that start in milliseconds: forked from one server that imported torch once.

A spawned rank is a fresh interpreter that imports torch, transformers and megatron-core again:
seconds per rank on a small host, on every run and in every test. `rank_context()` forks each rank
instead from multiprocessing's fork server, which imports those modules once per driver process
(only the ones the driver itself has imported: its ranks run the same code). The server does nothing
but import, so there is no thread pool, CUDA context or process group for a fork to inherit: ranks
may still use GPUs. What a spawned rank gets from its driver at start and a fork of the server would
not, it is handed: the driver's environment and its stdout/stderr as of the rank's start.
"""

from __future__ import annotations

import os
import sys
from multiprocessing import context as mp_context
from multiprocessing import reduction

SERVER_SETUP = "rlsmoke.engine.rank_server"  # first in the server: keeps torch's CUDA probe off the driver
HEAVY_MODULES = (
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "transformers",
    "transformers.models.glm4_moe.modeling_glm4_moe",
    "transformers.models.glm_moe_dsa.modeling_glm_moe_dsa",
    "transformers.models.glm5_next.modeling_glm5_next",
    "megatron.core",
    "megatron.core.models.gpt",
    "rlsmoke.engine.sharded",
    "rlsmoke.engine.megatron.model",
    "rlsmoke.engine.megatron.trainer",
)


class _DriverFd:
    """One of the driver's fds, duplicated into the rank as it starts."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):  # only pickled while a rank is being started: the fd travels with the request
        return _received_fd, (reduction.DupFd(self.fd),)


def _received_fd(dup) -> _DriverFd:
    return _DriverFd(dup.detach())


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class RankProcess(mp_context.ForkServerProcess):
    """A forkserver process that runs with its driver's environment and stdout/stderr of its start."""

    def start(self) -> None:
        self._driver_environ = dict(os.environ)
        self._driver_stdio = {fd: _DriverFd(fd) for fd in (1, 2) if _is_open(fd)}
        super().start()

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self._driver_environ)
        for target, received in self._driver_stdio.items():
            os.dup2(received.fd, target)
            os.close(received.fd)
        super().run()


class RankContext(mp_context.ForkServerContext):
    Process = RankProcess


def server_preload() -> list[str]:
    """What the fork server imports: the heavy modules the driver has imported itself."""
    return [SERVER_SETUP, *(name for name in HEAVY_MODULES if name in sys.modules)]


def rank_context() -> RankContext:
    """The multiprocessing context rank processes start from (Process, Pipe, ... as `get_context` gives).

    The preload takes effect when the server starts, at the driver's first rank; a server already
    running keeps what it imported.
    """
    ctx = RankContext()
    ctx.set_forkserver_preload(server_preload())
    return ctx
