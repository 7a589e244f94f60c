"""The two workers of a step as plain classes: the trainer and the rollout engine. Colocated they share a
process and a device; async each is a Ray actor (`engine.placement`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from rlsmoke.engine import kda, reuse, sync
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.model import TORCH_DTYPES, derive_policy, load_policy, process_settings
from rlsmoke.engine.rollout import Group, RolloutEngine, batch_for
from rlsmoke.engine.timing import Laps
from rlsmoke.engine.train import Trainer, set_dropout
from rlsmoke.engine.workers import TrainCalls


def worker_location() -> dict:
    """Process and accelerator ids of this worker (Ray's only when Ray is already running it)."""
    info: dict[str, object] = {"pid": os.getpid()}
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        ray = sys.modules["ray"]
        info["gpu_ids"] = [str(i) for i in ray.get_gpu_ids()]
        info["placement_group"] = ray.get_runtime_context().get_placement_group_id()
    return info


def trainer_options(cfg: RunConfig) -> dict[str, Any]:
    """The `Trainer` settings every train side takes from the run's config as they are."""
    return dict(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
                eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high, entropy_coef=cfg.entropy_coef,
                gradient_checkpointing=cfg.gradient_checkpointing, temperature=cfg.rollout_temperature,
                compute_dtype=TORCH_DTYPES[cfg.train_compute_dtype])  # fmt: skip


def rollout_engine(model, cfg: RunConfig, device: str, eos_id: int, pad_id: int) -> RolloutEngine:
    batch = batch_for(cfg.rollout_batch, device, cfg.spec.family, kda.choose(device, cfg.spec.family))
    return RolloutEngine(model, temperature=cfg.rollout_temperature, max_new_tokens=cfg.max_response_len,
                         eos_id=eos_id, pad_id=pad_id, inject=cfg.inject, batch=batch,
                         decode=cfg.rollout_decode)  # fmt: skip


class TrainWorker(TrainCalls):
    def __init__(self, cfg: RunConfig, ckpt: Path, threads: int | None = None):
        process_settings(threads)
        spec = cfg.spec
        self.cfg = cfg
        self.load_phases: dict[str, float] = {}
        lap = Laps(self.load_phases)
        model = load_policy(ckpt, spec, cfg.train_dtype, cfg.device)
        lap("read")
        # Megatron's bf16 params: a compute copy cast from the master weights (rlsmoke.engine.precision)
        compute = derive_policy(model, spec, cfg.train_compute_dtype) if cfg.separate_compute_copy else None
        if cfg.inject.kind == "train-dropout":
            set_dropout(compute or model, cfg.inject.value)
        ref = derive_policy(model, spec, cfg.train_dtype) if cfg.kl_coef else None
        lap("compute copy")
        self.trainer = Trainer(
            model, kl_coef=cfg.kl_coef, ref_model=ref, compute_model=compute, **trainer_options(cfg)
        )
        lap("trainer setup")

    def rollout_weights(self, model, dtype: torch.dtype):
        """What the rollout engine `model` should hold after a sync: the fp32 main weights, cast."""
        return sync.rollout_weights(self.trainer.master, dtype)

    def weights(self) -> list[tuple[str, torch.Tensor]]:
        """The update as it crosses a process boundary: CPU tensors in the rollout dtype."""
        return [(n, t.cpu()) for n, t in self.rollout_weights(None, TORCH_DTYPES[self.cfg.rollout_dtype])]

    def keep_initial(self) -> None:
        self.initial = reuse.InitialState(self.trainer, self.cfg)

    def restore_initial(self) -> None:
        self.initial.restore(self.trainer)

    def where(self) -> dict:
        return worker_location()


class RolloutWorker:
    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int, threads: int | None = None,
                 source=None, state=None):  # fmt: skip
        """`source`: the trainer's weights, cast; `state`: the tensors the trainer read. No second read."""
        process_settings(threads)
        spec = cfg.spec
        self.load_phases: dict[str, float] = {}
        lap = Laps(self.load_phases)
        if source is not None:
            self.model = derive_policy(source, spec, cfg.rollout_dtype)
        else:
            self.model = load_policy(ckpt, spec, cfg.rollout_dtype, cfg.device, state=state)
        lap("rollout copy")
        self.engine = rollout_engine(self.model, cfg, cfg.device, eos_id, pad_id)

    def generate(self, prompt_ids, n: int, seed: int) -> list[Group]:
        return self.engine.generate(prompt_ids, n, seed)

    def sync(self, weights, *, skip: bool) -> dict[str, float]:
        return sync.load_and_compare(self.model, weights, load=not skip)

    def keep_initial(self, weights) -> None:
        self.kept = reuse.DerivedCopy(self.model, weights)

    def restore_initial(self, weights) -> None:
        self.kept.restore(self.model, weights)

    def where(self) -> dict:
        return worker_location()
