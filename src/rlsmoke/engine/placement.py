"""Placement: who runs where. Colocate is one process; async is Ray actors on separate bundles.

The two workers are plain classes. Colocated, they share a process and a device; async, each is a
Ray actor pinned to its own placement-group bundle (train GPUs first, then rollout GPUs), as Miles
places its actor and its SGLang engines. Ray is imported only in async mode: the single-process
mode must run where Ray is not installed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import torch

from rlsmoke.engine import sync
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.model import TORCH_DTYPES, load_policy
from rlsmoke.engine.offload import Phases
from rlsmoke.engine.rollout import Group, RolloutEngine
from rlsmoke.engine.train import Trainer, set_dropout
from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.models import model_spec


def _setup(threads: int | None) -> None:
    """Per-process settings, in the driver or a Ray actor: the same seed must give the same bits."""
    import transformers

    if threads:
        torch.set_num_threads(threads)
    # CPU backward (MoE index ops) is otherwise nondeterministic in the last bits; measured, not assumed.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _where() -> dict:
    """Process and accelerator ids of this worker (Ray's only when Ray is already running it)."""
    info = {"pid": os.getpid()}
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        ray = sys.modules["ray"]
        info["gpu_ids"] = [str(i) for i in ray.get_gpu_ids()]
        info["placement_group"] = ray.get_runtime_context().get_placement_group_id()
    return info


class TrainWorker:
    def __init__(self, cfg: RunConfig, ckpt: Path, threads: int | None = None):
        _setup(threads)
        spec = model_spec(cfg.case, tiny=cfg.tiny)
        self.cfg = cfg
        model = load_policy(ckpt, spec, cfg.train_dtype, cfg.device)
        # Megatron's bf16 params: a compute copy loaded as the rollout engine loads its own (rlsmoke.engine.precision)
        compute = load_policy(ckpt, spec, cfg.train_compute_dtype, cfg.device) if cfg.separate_compute_copy else None
        if cfg.inject.kind == "train-dropout":
            set_dropout(compute or model, cfg.inject.value)
        ref = load_policy(ckpt, spec, cfg.train_dtype, cfg.device) if cfg.kl_coef else None
        self.trainer = Trainer(
            model, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
            eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high, entropy_coef=cfg.entropy_coef,
            kl_coef=cfg.kl_coef, ref_model=ref, gradient_checkpointing=cfg.gradient_checkpointing,
            compute_dtype=TORCH_DTYPES[cfg.train_compute_dtype], compute_model=compute,
            temperature=cfg.rollout_temperature,
        )  # fmt: skip

    def forward_only(self, groups: list[Group]):
        return self.trainer.forward_only(groups)

    def step(self, groups, old, advantages) -> dict[str, float]:
        return self.trainer.step(groups, old, advantages)

    def rollout_weights(self, model, dtype: torch.dtype):
        """What the rollout engine `model` should hold after a sync: the fp32 main weights, cast."""
        return sync.rollout_weights(self.trainer.master, dtype)

    def weights(self) -> list[tuple[str, torch.Tensor]]:
        """The update as it crosses a process boundary: CPU tensors in the rollout dtype."""
        return [(n, t.cpu()) for n, t in self.rollout_weights(None, TORCH_DTYPES[self.cfg.rollout_dtype])]

    def where(self) -> dict:
        return _where()


class RolloutWorker:
    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int, threads: int | None = None):
        _setup(threads)
        self.model = load_policy(ckpt, model_spec(cfg.case, tiny=cfg.tiny), cfg.rollout_dtype, cfg.device)
        self.engine = RolloutEngine(self.model, temperature=cfg.rollout_temperature,
                                    max_new_tokens=cfg.max_response_len, eos_id=eos_id, pad_id=pad_id,
                                    inject=cfg.inject)  # fmt: skip

    def generate(self, prompt_ids, n: int, seed: int) -> list[Group]:
        return self.engine.generate(prompt_ids, n, seed)

    def load(self, weights) -> int:
        return sync.load_weights(self.model, weights)

    def compare(self, weights) -> dict[str, float]:
        return sync.compare(self.model, weights)

    def where(self) -> dict:
        return _where()


class Colocated:
    """One process, one device: the rollout engine keeps its own copy in the rollout dtype.

    The train state and the rollout copy take turns on the device between phases (`engine.offload`).
    """

    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int):
        self.cfg = cfg
        if cfg.device.startswith("cuda"):  # the load phase's peak counts from here (a --repeat reuses the process)
            torch.cuda.reset_peak_memory_stats()
        self.train = train_worker(cfg, ckpt)
        self.rollout = RolloutWorker(cfg, ckpt, eos_id, pad_id)
        self.phases = Phases(device=cfg.device, offload=cfg.offload_active, trainer=self.train.trainer,
                             rollout_model=self.rollout.model)  # fmt: skip
        self.where = {"train": _where(), "rollout": _where()}

    def generate(self, prompt_ids, n, seed):
        self.phases.enter("rollout")
        return self.rollout.generate(prompt_ids, n, seed)

    def forward_only(self, groups):
        self.phases.enter("train")
        return self.train.forward_only(groups)

    def step(self, groups, old, advantages):
        self.phases.enter("train")
        self.phases.for_step()
        return self.train.step(groups, old, advantages)

    def memory(self) -> list:
        """Peak allocated device memory by phase (GiB), one entry per rank; [None] off CUDA."""
        return [self.phases.meter.report()]

    def offload_state(self) -> list[dict]:
        return [self.phases.state()]

    def sync(self, *, skip: bool) -> dict[str, float]:
        self.phases.enter("sync")
        dtype = TORCH_DTYPES[self.cfg.rollout_dtype]
        model = self.rollout.model
        return sync.load_and_compare(model, self.train.rollout_weights(model, dtype), load=not skip)

    def close(self) -> None:
        pass


class RayAsync:
    """Two actors on two bundles of one placement group: bundle 0 trains, bundle 1 rolls out.

    The engine starts a local Ray cluster on loopback with logical GPUs (real ones on a GPU host)
    and stops it in close(); it never attaches to a cluster it did not start.
    """

    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int):
        try:
            import ray
            from ray.util.placement_group import placement_group, remove_placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError:
            raise RlsmokeError(
                "mode=async needs Ray, which is not installed",
                rule="engine.ray",
                fix="pip install 'rlsmoke[ray]', or run with --mode colocate --num-gpus 1",
            ) from None
        self.ray, self._remove_pg, self.cfg = ray, remove_placement_group, cfg
        gpus = cfg.num_gpus
        sigterm = signal.getsignal(signal.SIGTERM)
        ray.init(address="local", num_cpus=max(2, gpus), num_gpus=gpus, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}})  # fmt: skip
        if callable(sigterm) and threading.current_thread() is threading.main_thread():
            # Ray's core worker takes SIGTERM over (an abort with a stack dump): give the caller's back.
            signal.signal(signal.SIGTERM, sigterm)
        try:
            bundles = [{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}]  # (train, rollout)
            self.pg = placement_group(bundles, strategy="PACK")
            ray.get(self.pg.ready(), timeout=60)

            def on(bundle: int):
                strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle)
                return {"num_cpus": 1, "num_gpus": 1, "scheduling_strategy": strategy}

            # One CPU per bundle: a thread each, so the two actors do not fight over 2 cores.
            self.train = ray.remote(TrainWorker).options(**on(0)).remote(cfg, ckpt, 1)
            self.rollout = ray.remote(RolloutWorker).options(**on(1)).remote(cfg, ckpt, eos_id, pad_id, 1)
            self.where = {
                "train": self._get(self.train.where.remote()),
                "rollout": self._get(self.rollout.where.remote()),
            }
        except BaseException:  # an interrupt too: never leave the cluster behind
            self.close()
            raise

    def _get(self, ref):
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else None
            if isinstance(cause, (RunError, RlsmokeError, torch.OutOfMemoryError)):
                raise cause from None
            raise RunError(
                f"a Ray worker failed: {str(exc).strip().splitlines()[-1]}", rule="engine.worker"
            ) from None
        except self.ray.exceptions.RayActorError as exc:
            raise RunError(f"a Ray actor died: {str(exc).splitlines()[0]}", rule="engine.worker") from None

    def generate(self, prompt_ids, n, seed):
        return self._get(self.rollout.generate.remote(prompt_ids, n, seed))

    def forward_only(self, groups):
        return self._get(self.train.forward_only.remote(groups))

    def step(self, groups, old, advantages):
        return self._get(self.train.step.remote(groups, old, advantages))

    def memory(self) -> list:
        return [None, None]  # not metered across Ray actors

    def sync(self, *, skip: bool) -> dict[str, float]:
        weights = self.train.weights.remote()  # an object ref: the driver never copies the weights
        if not skip:
            self._get(self.rollout.load.remote(weights))
        return self._get(self.rollout.compare.remote(weights))

    def close(self) -> None:
        if not self.ray.is_initialized():
            return
        for actor in ("train", "rollout"):
            if hasattr(self, actor):
                self.ray.kill(getattr(self, actor))
        if hasattr(self, "pg"):
            self._remove_pg(self.pg)
        self.ray.shutdown()


def train_worker(cfg: RunConfig, ckpt: Path):
    if cfg.trainer == "megatron":
        from rlsmoke.engine.megatron.trainer import MegatronTrainWorker

        return MegatronTrainWorker(cfg, ckpt)
    return TrainWorker(cfg, ckpt)


def open_workers(cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.mode == "async":
        return RayAsync(cfg, ckpt, eos_id, pad_id)
    if cfg.num_gpus > 1:
        from rlsmoke.engine.sharded import Sharded  # FSDP2 over the actor GPUs, one process per rank

        return Sharded(cfg, ckpt, eos_id, pad_id)
    return Colocated(cfg, ckpt, eos_id, pad_id)
