"""Rank processes that start in milliseconds: forked from one server that imported torch once.

A spawned rank re-imports torch, transformers and megatron-core: seconds per rank, on every run and
test. The fork server only imports, so there is no thread pool, CUDA context or process group to
inherit; a rank is handed the driver's environment and stdout/stderr. CPU ranks of a driver that holds
nothing a fork could break (`fork_is_safe`) fork from the driver itself. Every rank dies with its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import importlib.util
import os
import socket
import sys
import threading
from multiprocessing import context as mp_context
from multiprocessing import reduction
from pathlib import Path

from rlsmoke.engine import signals

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
)
# fla asks the device's name as it imports (GLM-5.3-Flash's modeling imports it): imported ahead of a fork,
# it would leave every child unable to use CUDA, so the process that runs it imports it itself.
ASK_THE_DEVICE_WITH_FLA = ("transformers.models.glm5_next.modeling_glm5_next",)


def preloadable(names) -> tuple[str, ...]:
    """`names` less what would initialize a GPU driver as it imports on this host."""
    skipped = ASK_THE_DEVICE_WITH_FLA if importlib.util.find_spec("fla") is not None else ()
    return tuple(name for name in names if name not in skipped)


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


class ForkedRank(mp_context.ForkProcess):
    """A rank forked from its driver; it dies with the driver."""

    def start(self) -> None:
        self._driver = os.getpid()
        super().start()

    def run(self) -> None:
        signals.in_child(self._driver)
        renew_thread_pool()
        super().run()


def renew_thread_pool() -> None:
    """torch renews a forked pool on the first thread that asks for it; two threads at once (transformers'
    loader) can find none ("Invalid thread pool!"), so the fork's one thread asks first."""
    if (torch := sys.modules.get("torch")) is not None:
        torch.set_num_threads(torch.get_num_threads())


class RankProcess(mp_context.ForkServerProcess):
    """A forkserver process that runs with its driver's environment and stdout/stderr of its start."""

    def start(self) -> None:
        self._driver = os.getpid()
        self._driver_environ = dict(os.environ)
        self._driver_stdio = {fd: _DriverFd(fd) for fd in (1, 2) if _is_open(fd)}
        super().start()

    def run(self) -> None:
        signals.in_child(self._driver)
        os.environ.clear()
        os.environ.update(self._driver_environ)
        for target, received in self._driver_stdio.items():
            os.dup2(received.fd, target)
            os.close(received.fd)
        renew_thread_pool()
        super().run()


class ForkContext(mp_context.ForkContext):
    Process = ForkedRank


class RankContext(mp_context.ForkServerContext):
    Process = RankProcess


def _stop_progress_monitors() -> None:
    """tqdm's monitor threads, which a bar leaves running; the next bar starts its own again."""
    if (tqdm_std := sys.modules.get("tqdm.std")) is not None:
        for thread in threading.enumerate():
            if isinstance(thread, tqdm_std.TMonitor):
                thread.exit()


# torch's process-group threads outlive the group, and a fork's child crashes on their state (SIGSEGV).
DISTRIBUTED_THREADS = ("pt_", "gloo", "nccl", "NCCL")
# autograd's per-GPU threads: no group's, and `fork_is_safe` rules on the GPU driver itself.
AUTOGRAD_DEVICE_THREADS = "pt_autograd_"
LIVE_GROUP = "an initialized process group"


def distributed_leftovers() -> list[str]:
    """What process groups left in this process: a live group, and torch's threads that outlive it."""
    torch = sys.modules.get("torch")
    names = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # ended while we looked
            names.add(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    left = sorted(
        n for n in names if n.startswith(DISTRIBUTED_THREADS) and not n.startswith(AUTOGRAD_DEVICE_THREADS)
    )
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        left.insert(0, LIVE_GROUP)
    return left


# A fork's child cannot use a GPU driver its parent initialized, even for a CPU run's optimizer (Adam asks
# whether a graph is being captured: "CUDA error: initialization error", measured on an H200).
CUDA_DRIVER = "libcuda.so"  # mapped when a CUDA build of torch is imported, initialized only when used
HIP_RUNTIME = "libamdhip64.so"  # cannot be asked without initializing it: mapped at all rules forks out
CUDA_ERROR_NOT_INITIALIZED = 3


def gpu_driver_initialized() -> bool:
    """Whether this process has initialized a GPU driver that a fork's child would inherit unusable."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # /proc cannot say: only a GPU build of torch could have started one
        torch = sys.modules.get("torch")
        return torch is None or bool(torch.version.cuda or torch.version.hip)
    files = {line[line.index("/") :] for line in maps.splitlines() if "/" in line}
    if any(Path(file).name.startswith(HIP_RUNTIME) for file in files):
        return True
    if not (cuda := sorted(file for file in files if Path(file).name.startswith(CUDA_DRIVER))):
        return False
    try:
        driver = ctypes.CDLL(cuda[-1])  # the copy already in the process: nothing is loaded
    except OSError:
        return True
    # asks, initializes nothing
    return driver.cuDeviceGetCount(ctypes.byref(ctypes.c_int())) != CUDA_ERROR_NOT_INITIALIZED


def fork_is_safe() -> bool:
    """Nothing a fork would copy half-way: other threads, an OpenMP team, a GPU driver, a process group."""
    torch = sys.modules.get("torch")
    _stop_progress_monitors()
    sharer = sys.modules.get("multiprocessing.resource_sharer")
    # multiprocessing's fd sharer: its owner resets it in a fork's child
    fork_aware = getattr(getattr(sharer, "_resource_sharer", None), "_thread", None)
    others = set(threading.enumerate()) - {threading.main_thread(), fork_aware}
    if others or distributed_leftovers() or gpu_driver_initialized():
        return False
    return torch is None or (torch.get_num_threads() == 1 and not torch.cuda.is_initialized())


@contextlib.contextmanager
def frozen_for_forks():
    """Forked ranks' collections neither walk the driver's objects (0.25 s each) nor copy their pages."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def rank_context(cpu_only: bool = False, rank_modules: tuple[str, ...] = ()) -> mp_context.BaseContext:
    """The context ranks start from: forked from the driver where safe (`cpu_only`), else the fork server."""
    if cpu_only and fork_is_safe():
        megatron = any(name.startswith("rlsmoke.engine.megatron") for name in rank_modules)
        for name in preloadable((*HEAVY_MODULES, *rank_modules)):
            if megatron or not name.startswith("megatron"):
                with contextlib.suppress(ImportError):  # megatron-core is an optional extra
                    importlib.import_module(name)
        return ForkContext()
    ctx = RankContext()
    preload = [name for name in preloadable((*HEAVY_MODULES, *rank_modules)) if name in sys.modules]
    ctx.set_forkserver_preload([SERVER_SETUP, *preload])
    return ctx


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
