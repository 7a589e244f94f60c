"""Training across several devices: FSDP2 over the plan's actor GPUs, one process per rank.

Each rank is a data-parallel replica of the colocated flow: an FSDP2 shard of the trainer, loaded on the
host so no rank holds the whole fp32 model on its GPU, and a full rollout copy. The driver speaks to the
ranks through pipes: the same path with gloo on CPU (CI) and NCCL on GPUs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlsmoke.engine import signals
from rlsmoke.engine.config import RunConfig, executed_layout
from rlsmoke.engine.model import TORCH_DTYPES, load_policy, process_settings
from rlsmoke.engine.offload import Phases, local_shard
from rlsmoke.engine.procs import frozen_for_forks, rank_context
from rlsmoke.engine.rollout import Group, rollout_engine
from rlsmoke.engine.train import Trainer, set_dropout, trainer_options
from rlsmoke.engine.workers import SharedDevice
from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.platforms import cpu_share


def decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one (text tower of a multimodal model included)."""
    layers = [
        m
        for name, m in model.named_modules()
        if name.endswith(".layers") and isinstance(m, torch.nn.ModuleList)
    ]
    if not layers:
        raise RunError(f"no decoder layers found in {type(model).__name__}", rule="engine.fsdp")
    return [block for ml in layers for block in ml]


def shard(model, *, device_type: str, dtype: torch.dtype | None) -> None:
    """FSDP2 in `dtype` on `device_type`'s mesh (else a gloo run on a GPU host shards onto cuda:0)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    for block in decoder_layers(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


class ShardedTrainer(Trainer):
    """`Trainer` with its per-token metrics made global across the ranks."""

    def __init__(self, model, *, comm_device: str, **kwargs):
        super().__init__(model, **kwargs)
        self.comm_device = comm_device

    def global_sum(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t)
        return t.item()

    def step(self, groups, old, advantages) -> dict[str, float]:
        local_tokens = float(sum(g.mask.sum() for g in groups))
        metrics = super().step(groups, old, advantages)
        # Per-token means were over this rank's tokens: weight them back to the global mean.
        total = self.global_sum(local_tokens)
        for key in ("train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/entropy_loss", "train/kl_loss",
                    "train/loss"):  # fmt: skip
            metrics[key] = self.global_sum(metrics[key] * local_tokens) / max(total, 1.0)
        return metrics


class Rank(SharedDevice):
    """One process of the sharded run: a trainer shard and a full rollout copy on its device."""

    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int, rank: int, world: int):
        self.cfg, self.rank, self.world = cfg, rank, world
        spec = cfg.spec
        on_gpu = cfg.device.startswith("cuda")
        self.device = f"cuda:{rank}" if on_gpu else "cpu"
        if on_gpu:
            torch.cuda.set_device(rank)
        model = load_policy(ckpt, spec, cfg.train_dtype, "cpu")  # fully_shard moves each shard to the device
        if cfg.inject.kind == "train-dropout":
            set_dropout(model, cfg.inject.value)
        low = TORCH_DTYPES[cfg.rollout_dtype] if on_gpu else None  # bf16 compute and reduce on GPUs
        shard(model, device_type="cuda" if on_gpu else "cpu", dtype=low)
        self.trainer = ShardedTrainer(model, comm_device=self.device, **trainer_options(cfg))
        self.rollout_model = load_policy(ckpt, spec, cfg.rollout_dtype, self.device)
        self.engine = rollout_engine(self.rollout_model, cfg, self.device, eos_id, pad_id)
        self.engine.capture(len(range(rank, cfg.n_prompts, world)), cfg.n_samples)  # this rank's share
        self.phases = Phases(cfg, self.device, self.trainer, self.rollout_model, ranks_on_host=world)

    def rollout_weights(self):
        """Each parameter gathered in full and cast to the rollout dtype, one at a time (every rank in order)."""
        dtype = TORCH_DTYPES[self.cfg.rollout_dtype]
        for name, p in self.trainer.model.named_parameters():
            t = p.detach()
            yield name, (t.full_tensor() if hasattr(t, "full_tensor") else t).to(dtype)

    def sync(self, skip: bool) -> dict[str, float]:
        result = super().sync(skip=skip)
        mismatched = self.trainer.global_sum(result["sync/mismatched_params"])
        return {**result, "sync/mismatched_params": mismatched, "sync/ranks": float(self.world)}

    def where(self) -> dict:
        shards_on = {local_shard(p).device.type for p in self.trainer.model.parameters()}
        info = {
            "pid": os.getpid(),
            "rank": self.rank,
            "world": self.world,
            "device": self.device,
            "shards_on": sorted(shards_on),
            "threads": torch.get_num_threads(),
        }
        if self.device.startswith("cuda"):
            info["gpu"] = torch.cuda.get_device_name(self.rank)
        return info


def _serve(
    conn, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int, rank: int, world: int, store: str
) -> None:
    signals.in_rank()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    process_settings(cpu_share(world))  # this run's thread budget (a pytest worker's share), split by rank
    backend = "nccl" if cfg.device.startswith("cuda") else "gloo"
    try:
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
        worker = Rank(cfg, ckpt, eos_id, pad_id, rank, world)
        conn.send(("ok", worker.where()))
        while True:
            method, args = conn.recv()
            if method == "close":
                break
            conn.send(("ok", getattr(worker, method)(*args)))
    except Exception as exc:  # the driver re-raises it as the rank's
        conn.send(("error", (type(exc).__name__, str(exc), getattr(exc, "rule", ""))))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        conn.close()


def _on_every_rank(method: str) -> Callable[..., Any]:
    """The same call on every rank; the answers in rank order."""
    return lambda self, *args: self._call(method, [args] * self.world)


def _one_entry_per_rank(method: str) -> Callable[..., list]:
    """A call whose answer has an entry per rank (`SharedDevice.memory`): every rank's, in rank order."""
    return lambda self: [entry for answer in self._call(method, [()] * self.world) for entry in answer]


class Sharded:
    """The driver: W rank processes, each given its share of the prompts; results gathered back."""

    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int):
        self.world = cfg.num_gpus
        if cfg.n_prompts % self.world:
            raise RlsmokeError(
                f"n_prompts={cfg.n_prompts} is not divisible by the {self.world} data-parallel ranks; every rank "
                "must run the same number of sharded forwards", rule="engine.dp_divides_prompts",
                fix=f"use --n-prompts {self.world * max(1, cfg.n_prompts // self.world)}",
            )  # fmt: skip
        ctx = rank_context(cpu_only=cfg.device == "cpu", rank_modules=(__name__,))  # no fresh import of torch
        self.conns, self.procs = [], []
        # the ranks meet in a file of their own, not at a port: two runs at once, or a MASTER_PORT that
        # another process holds, cannot mix their worlds
        self.rendezvous = tempfile.mkdtemp(prefix="rlsmoke-ranks-")
        try:  # an interrupt too: the ranks and the rendezvous are ours to remove
            with frozen_for_forks():
                for rank in range(self.world):
                    parent, child = ctx.Pipe()
                    args = (child, cfg, ckpt, eos_id, pad_id, rank, self.world, f"{self.rendezvous}/store")
                    self.procs.append(ctx.Process(target=_serve, args=args, daemon=True))
                    self.procs[-1].start()
                    self.conns.append(parent)
            self.where = {"ranks": self._gather()}
        except BaseException:
            self.close()
            raise

    def _gather(self) -> list:
        results = []
        for rank, conn in enumerate(self.conns):
            try:
                status, payload = conn.recv()
            except EOFError:
                raise RunError(
                    f"rank {rank} died (exit code {self.procs[rank].exitcode})", rule="engine.worker"
                ) from None
            if status == "error":
                name, message, rule = payload
                if name == "OutOfMemoryError":
                    raise torch.OutOfMemoryError(message)
                raise RunError(f"rank {rank}: {name}: {message}", rule=rule or "engine.worker")
            results.append(payload)
        return results

    def _call(self, method: str, per_rank_args: list[tuple]) -> list:
        for conn, args in zip(self.conns, per_rank_args, strict=True):
            conn.send((method, args))
        return self._gather()

    def _split(self, items: list) -> list[list]:
        return [items[r :: self.world] for r in range(self.world)]

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._call("manual_seed", [(seed,)] * self.world)

    drop_optimizer_state = _on_every_rank("drop_optimizer_state")
    memory = _one_entry_per_rank("memory")  # each rank's peak allocated device memory by phase (GiB)
    offload_state = _one_entry_per_rank("offload_state")
    keep_initial = _on_every_rank("keep_initial")
    restore_initial = _on_every_rank("restore_initial")
    set_variant = _on_every_rank("set_variant")

    def generate(self, prompt_ids, n, seed) -> list[Group]:
        shares = self._call("generate", [(prompt_ids, n, seed)] * self.world)
        return sorted((g for share in shares for g in share), key=lambda g: g.prompt_index)

    def forward_only(self, groups):
        return _interleave(self._call("forward_only", [(share,) for share in self._split(groups)]))

    def step(self, groups, old, advantages):
        args = list(zip(self._split(groups), self._split(old), self._split(advantages), strict=True))
        return self._call("step", args)[0]  # the metrics are all-reduced: every rank has the same

    def sync(self, *, skip: bool):
        results = self._call("sync", [(skip,)] * self.world)
        return {**results[0], "sync/max_abs_diff": max(r["sync/max_abs_diff"] for r in results)}

    def move_seconds(self) -> dict[str, float]:
        """Per phase, the slowest rank's seconds of offload moves."""
        per_rank = self._call("move_seconds", [()] * self.world)
        return {k: max(r.get(k, 0.0) for r in per_rank) for k in set().union(*per_rank)}

    def parallel(self) -> dict:
        return executed_layout(dp=self.world)

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(("close", ()))
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():  # only our own children, by handle
                proc.kill()
                proc.join()
        shutil.rmtree(self.rendezvous, ignore_errors=True)


def _interleave(shares: list[list]) -> list:
    """Undo `items[r::W]`: the r-th share's k-th item was item k*W + r."""
    items = [None] * sum(map(len, shares))
    for rank, share in enumerate(shares):
        items[rank :: len(shares)] = share
    return items
