"""Colocate memory time-sharing, as Miles' --colocate does it, and the per-phase device memory meter.

`Phases.enter` moves what the next phase does not use to host memory. Torch's pinned allocator rounds
blocks up to a power of two and caches them, so parked state is pinned only up to PIN_MAX_BYTES a rank
(`pins`); past that it is pageable and large tensors move through two reused pinned staging buffers (a
pageable copy straight from the device took 45 s of a 53 s seed, GLM-4.5 4-layer on one H200).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from rlsmoke.engine.limits import host_memory_bytes


def _is_dtensor(t) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "to_local")


def local_shard(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


# Each of the two pinned staging buffers; a smaller tensor moves in one piece.
STAGING_BYTES = 64 << 20
# A fresh pinned allocation costs more than the staged moves it saves over a few seeds (GLM-5 4-layer's
# 11 GiB took about 14 s to pin on an H200 host; staged moves ran at 10 GB/s): bench/gpu_limits.py.
PIN_MAX_BYTES = 4 << 30


def pins(nbytes: int, device: torch.device, *, ranks_on_host: int = 1) -> bool:
    """Pinned pages are locked: only where the host's ranks leave half its memory free."""
    return (
        device.type == "cuda"
        and nbytes <= PIN_MAX_BYTES
        and 4 * nbytes * ranks_on_host <= host_memory_bytes()
    )


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class HostCopies:
    def __init__(self, device: str, *, park_bytes: int = 0, ranks_on_host: int = 1):
        self.device, self.park_bytes = torch.device(device), park_bytes
        self.pin = pins(park_bytes, self.device, ranks_on_host=ranks_on_host)
        self.staged = self.device.type == "cuda" and not self.pin
        self._staging: list[torch.Tensor] = []
        self._done: list = [None, None]  # each buffer's last device copy (an event): reuse waits for it
        # each staged tensor's host copy, kept for its next park: fresh pageable pages fault in one by one
        self._parked: dict[object, torch.Tensor] = {}

    def to_host(self, t: torch.Tensor, key: object = None) -> torch.Tensor:
        """`key`: what the tensor is (a parameter, a buffer, a moment); its next park reuses this one's pages."""
        if self._stages(t):
            return self._staged_to_host(t, key)
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin)
        return host.copy_(t, non_blocking=self.pin)

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        return self._staged_to_device(t) if self._stages(t) else t.to(self.device, non_blocking=self.pin)

    def _stages(self, t: torch.Tensor) -> bool:
        return self.staged and t.is_contiguous() and t.numel() * t.element_size() > STAGING_BYTES

    def _buffers(self) -> list[torch.Tensor]:
        if not self._staging:
            pin = self.device.type == "cuda"  # on CPU the same chunking runs with plain buffers (CI)
            self._staging = [torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        return self._staging

    def _chunks(self, nbytes: int):
        for i, start in enumerate(range(0, nbytes, STAGING_BYTES)):
            yield i % 2, start, min(STAGING_BYTES, nbytes - start)

    def _wait(self, k: int) -> None:
        if self._done[k] is not None:
            self._done[k].synchronize()
            self._done[k] = None

    def _record(self, k: int) -> None:
        if self.device.type == "cuda":  # CPU copies are synchronous
            self._done[k] = torch.cuda.Event()
            self._done[k].record(torch.cuda.current_stream(self.device))

    def _staged_to_host(self, t: torch.Tensor, key: object = None) -> torch.Tensor:
        """Device -> pinned buffer (async) while the host copies the previous chunk out of the other one."""
        host = self._parked.get(key) if key is not None else None
        if host is None or host.shape != t.shape or host.dtype != t.dtype:
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            if key is not None:
                self._parked[key] = host
        src, dst, bufs = _byte_view(t), _byte_view(host), self._buffers()
        pending = None
        for k, start, n in self._chunks(src.numel()):
            self._wait(k)
            bufs[k][:n].copy_(src[start : start + n], non_blocking=True)
            self._record(k)
            if pending is not None:
                self._copy_out(dst, bufs, *pending)
            pending = (k, start, n)
        self._copy_out(dst, bufs, *pending)
        return host

    def _copy_out(self, dst: torch.Tensor, bufs: list[torch.Tensor], k: int, start: int, n: int) -> None:
        self._wait(k)
        dst[start : start + n].copy_(bufs[k][:n])

    def _staged_to_device(self, t: torch.Tensor) -> torch.Tensor:
        """The host fills one pinned buffer while the device reads the other (async)."""
        dev = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        src, dst, bufs = _byte_view(t), _byte_view(dev), self._buffers()
        for k, start, n in self._chunks(src.numel()):
            self._wait(k)  # the device has finished reading this buffer's last chunk
            bufs[k][:n].copy_(src[start : start + n])
            dst[start : start + n].copy_(bufs[k][:n], non_blocking=True)
            self._record(k)
        return dev

    @torch.no_grad()
    def module(self, module: torch.nn.Module, where: str, *, skip: frozenset[int] = frozenset()) -> None:
        def move(t, key):
            return self.to_host(t, key) if where == "host" else self.to_device(t)

        if any(_is_dtensor(p) for p in module.parameters()):
            module.to("cpu" if where == "host" else self.device)  # FSDP2's _apply re-registers the shards
        else:
            for p in module.parameters():
                if id(p) not in skip:
                    p.data = move(p.data, p)
            for sub in module.modules():
                for name, b in sub._buffers.items():
                    if b is not None:
                        sub._buffers[name] = move(b, (sub, name))
        self._sync()

    @torch.no_grad()
    def optimizer_state(self, optimizer: torch.optim.Optimizer, where: str) -> None:
        for state in optimizer.state.values():
            for key, t in list(state.items()):
                if not isinstance(t, _HostShard) and (not torch.is_tensor(t) or t.dim() == 0):
                    continue  # the step counter stays where AdamW keeps it
                state[key] = self._move_state(t, where, (id(state), key))
        self._sync()

    def _move_state(self, t, where: str, key: object):
        if where == "host":
            return _HostShard(self.to_host(t.to_local(), key), t) if _is_dtensor(t) else self.to_host(t, key)
        if isinstance(t, _HostShard):
            from torch.distributed.tensor import DTensor

            return DTensor.from_local(
                self.to_device(t.local), t.mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride
            )
        return self.to_device(t)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _bytes(module: torch.nn.Module) -> int:
    return sum(local_shard(p).numel() * local_shard(p).element_size() for p in module.parameters())


class _HostShard:
    """A DTensor's local shard parked in host memory, with what rebuilds the DTensor on the device."""

    def __init__(self, local: torch.Tensor, like):
        self.local, self.mesh, self.placements = local, like.device_mesh, like.placements
        self.shape, self.stride = like.shape, like.stride()


class MemoryMeter:
    """Peak allocated device memory per phase (`torch.cuda.max_memory_allocated`); None off CUDA."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.on = self.device.type == "cuda"
        self.peaks: dict[str, int] = {}
        # measured from the last reset: process start, or `reset_peak_memory_stats` before loading
        self.phase = "load"

    def enter(self, phase: str) -> None:
        self.close()
        self.phase = phase
        if self.on:
            torch.cuda.reset_peak_memory_stats(self.device)

    def close(self) -> None:
        if self.on:
            peak = torch.cuda.max_memory_allocated(self.device)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), peak)

    def report(self) -> dict[str, float] | None:
        """The peaks since the last report, then a new window: each `--variants` run reports its own."""
        if not self.on:
            return None
        self.close()
        peaks, self.peaks = {k: round(v / 2**30, 2) for k, v in self.peaks.items()}, {}
        torch.cuda.reset_peak_memory_stats(self.device)
        return peaks


# Where each part is in a phase. The moments come back only for a step (`for_step`): in "train", which
# scores the last rollout too, they stay where they are.
RESIDENCY = {
    "rollout": {"train_params": "host", "optimizer_state": "host", "rollout_copy": "device"},
    "train": {"train_params": "device", "rollout_copy": "host"},
    "sync": {"train_params": "device", "optimizer_state": "host", "rollout_copy": "device"},
}


class Phases:
    def __init__(self, cfg, device: str, trainer, rollout_model, ranks_on_host: int = 1):
        self.offload, self.offload_train = cfg.offload_active, cfg.offload_train_active
        # parked at most: the rollout copy, and the master and two moments; not the compute copy, which is
        # freed and cast again on return (`_park_compute`)
        park = _bytes(rollout_model) if self.offload else 0
        if self.offload_train:
            park += 3 * _bytes(trainer.master)
        self.copies = HostCopies(device, park_bytes=park, ranks_on_host=ranks_on_host)
        self.trainer, self.rollout_model = trainer, rollout_model
        self.meter = MemoryMeter(device)
        self.where = {"train_params": "device", "optimizer_state": "device", "rollout_copy": "device"}
        # seconds spent moving, by the phase that asked
        self.move_seconds: dict[str, float] = defaultdict(float)
        self._rebuilt: list = []  # (compute, main) pairs whose compute storage is freed while parked
        # a sync that loads every weight rewrites the rollout copy: its parameters are freed, not parked (GLM-4.5
        # 4-layer on one H200: 7.7 s of a 13.4 s seed moved 12.9 GB out and back); stale-weights keeps them
        self.sync_rewrites = not cfg.inject.skips_sync
        self._released: list = []  # (parameter, shape) of the rollout copy, freed until the sync

    def enter(self, phase: str) -> None:
        """What leaves moves in the old phase's window; what comes back counts in the phase that uses it."""
        if phase == self.meter.phase:
            return
        if phase in ("rollout", "sync"):
            # after a step the grads are dead weight: they held 21 GiB through GLM-5's rollout on one H200
            self.trainer.optimizer.zero_grad(set_to_none=True)
        moves = []
        if self.offload:
            want = RESIDENCY[phase]
            if not self.offload_train:  # the train state stays: only the rollout copy takes turns
                want = want | {"train_params": "device", "optimizer_state": "device"}
            moves = [(part, where) for part, where in want.items() if self.where[part] != where]
        for part, where in moves:
            if where == "host":
                self._move(part, where, phase)
        self.meter.enter(phase)
        for part, where in moves:
            if where == "device":
                self._move(part, where, phase)

    @torch.no_grad()
    def _park_compute(self) -> None:
        """The compute copy to the host, its exact casts of the master freed and cast again on return."""
        model, self._rebuilt = self.trainer.model, []
        if model is self.trainer.master:
            return
        for p, main in getattr(self.trainer, "_pairs", []):
            if not _is_dtensor(p) and p.device == main.device and torch.equal(p, main.to(p.dtype)):
                self._rebuilt.append((p, main))
        self.copies.module(model, "host", skip=frozenset(id(p) for p, _ in self._rebuilt))
        for p, _ in self._rebuilt:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    @torch.no_grad()
    def _return_compute(self) -> None:
        model = self.trainer.model
        if model is self.trainer.master:
            return
        self.copies.module(model, "device", skip=frozenset(id(p) for p, _ in self._rebuilt))
        for p, main in self._rebuilt:
            p.data = main.detach().to(p.dtype)
        self._rebuilt = []

    @torch.no_grad()
    def _move_rollout_copy(self, where: str) -> None:
        """Its buffers move; its parameters too, unless what comes back for them is the sync's load (or
        `--repeat`'s restore, which writes every one as well)."""
        model = self.rollout_model
        if where == "host" and self.sync_rewrites and not any(_is_dtensor(p) for p in model.parameters()):
            self._released = [(p, p.shape) for p in model.parameters()]
            for p, _ in self._released:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self.copies.module(model, where, skip=frozenset(id(p) for p, _ in self._released))
        if where == "device":
            for p, shape in self._released:
                p.data = torch.empty(shape, dtype=p.dtype, device=self.copies.device)
            self._released = []

    def for_step(self) -> None:
        """The AdamW moments back on the device, right before the optimizer needs them."""
        if self.offload and self.where["optimizer_state"] == "host":
            self._move("optimizer_state", "device", "step")

    def state(self) -> dict:
        """Where each part is, the moments' pinning and parked shards, how many master params hold a grad."""
        held = [t for st in self.trainer.optimizer.state.values() for t in st.values()
                if isinstance(t, _HostShard) or (torch.is_tensor(t) and t.dim() > 0)]  # fmt: skip
        # a DTensor's own is_pinned has no sharding rule in a CUDA build of torch: its shard answers
        local = [t.local if isinstance(t, _HostShard) else local_shard(t) for t in held]
        return {**self.where, "offload": self.offload, "offload_train": self.offload_train,
                "optimizer_pinned": sorted({bool(t.is_pinned()) for t in local if t.device.type == "cpu"}),
                "optimizer_parked_shards": sum(isinstance(t, _HostShard) for t in held),
                "compute_rebuilt": len(self._rebuilt),  # parked compute parameters cast again on return
                "rollout_released": len(self._released),  # rollout parameters freed until the sync writes them
                "grads_held": sum(p.grad is not None for p in self.trainer.master.parameters())}  # fmt: skip

    def _move(self, part: str, where: str, asked_by: str) -> None:
        start = time.perf_counter()
        if part == "train_params" and where == "host":
            self._park_compute()  # before the master leaves: whether a parameter is its cast needs both
            self.copies.module(self.trainer.master, where)
        elif part == "train_params":
            self.copies.module(self.trainer.master, where)
            self._return_compute()
        elif part == "optimizer_state":
            self.copies.optimizer_state(self.trainer.optimizer, where)
        else:
            self._move_rollout_copy(where)
        self.where[part] = where
        if self.copies.device.type == "cuda" and where == "host":
            torch.cuda.empty_cache()
        self.move_seconds[asked_by] += time.perf_counter() - start
