"""Placement: the two workers of a step, the trainer and the rollout engine, as plain classes. Colocate is
one process where they share a device; async is a Ray actor each on separate bundles, as Miles places its
actor and its SGLang engines. Ray is imported only in async mode."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from rlsmoke.engine import kda, reuse, signals, sync
from rlsmoke.engine.config import RunConfig, executed_layout
from rlsmoke.engine.model import TORCH_DTYPES, derive_policy, load_policy, process_settings
from rlsmoke.engine.offload import Phases
from rlsmoke.engine.rollout import Group, rollout_engine
from rlsmoke.engine.timing import Laps
from rlsmoke.engine.train import Trainer, set_dropout, trainer_options
from rlsmoke.engine.workers import Placement, SharedDevice, TrainCalls, TrainSide
from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.processes import runner


def worker_location() -> dict:
    """Process and accelerator ids of this worker (Ray's only when Ray is already running it)."""
    info: dict[str, object] = {"pid": os.getpid()}
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        ray = sys.modules["ray"]
        info["gpu_ids"] = [str(i) for i in ray.get_gpu_ids()]
        info["placement_group"] = ray.get_runtime_context().get_placement_group_id()
    return info


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
        if self.engine.static is not None and self.engine.static.compiled:
            self.engine.capture(cfg.n_prompts, cfg.n_samples)
            lap("rollout capture")  # its seconds, whether it took or fell back to generate

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


class Colocated(SharedDevice):
    """One process, one device: the rollout engine keeps its own copy in the rollout dtype."""

    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int):
        self.cfg = cfg
        if cfg.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()  # the load phase's peak counts from here (a --repeat reuses the process)
        self.train = train_worker(cfg, ckpt)
        master = self.train.trainer.master if isinstance(self.train, TrainWorker) else None
        read = getattr(self.train, "take_checkpoint", lambda: None)()  # the megatron trainer's read
        self.rollout = RolloutWorker(cfg, ckpt, eos_id, pad_id, source=master, state=read)
        self.trainer = self.train.trainer
        self.rollout_model, self.engine = self.rollout.model, self.rollout.engine
        # where the load's seconds go (summary.json timing.load_phases_s)
        self.load_phases = {**getattr(self.train, "load_phases", {}), **self.rollout.load_phases}
        self.compile_s = 0.0
        if kda.choose(cfg.device, cfg.spec.family) == "fla":  # Triton compiles here, not in the first seed
            generate_rows = cfg.n_samples * (cfg.n_prompts if self.engine.batch == "rank" else 1)
            # the trainer forwards one group at a time
            models = [(self.rollout_model, False, generate_rows), (self.trainer.model, True, cfg.n_samples)]
            try:  # one layer at a call's rows and under 100 tokens: MiBs beside the load's peak
                self.compile_s = kda.warm_up(models)
            except Exception as exc:  # noqa: BLE001 - the run goes on; the compile is then paid in the first seed
                print(f"warning: KDA warm-up failed ({type(exc).__name__}: {exc}); the first seed compiles",
                      file=sys.stderr)  # fmt: skip
        self.phases = Phases(cfg, cfg.device, self.trainer, self.rollout_model)
        self.where = {"train": worker_location(), "rollout": worker_location()}

    def parallel(self) -> dict:
        """The training layout as executed (the megatron trainer's own, else one data-parallel rank)."""
        return self.train.parallel() if hasattr(self.train, "parallel") else executed_layout(dp=1)

    def rollout_weights(self):
        return self.train.rollout_weights(self.rollout_model, TORCH_DTYPES[self.cfg.rollout_dtype])

    def close(self) -> None:
        pass


class RayAsync:
    """Two actors on one placement group (bundle 0 trains, 1 rolls out) on a local Ray cluster of ours."""

    def __init__(self, cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int):
        if "ray" not in sys.modules:  # Ray reads it once, on import; the cluster's head is given the same
            os.environ.setdefault("RAY_AUTH_MODE", "token")
        try:
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError:
            raise RlsmokeError(
                "mode=async needs Ray, which is not installed",
                rule="engine.ray",
                fix="pip install 'rlsmoke[ray]', or run with --mode colocate --num-gpus 1",
            ) from None
        self.ray, self.cluster = ray, None
        gpus = cfg.num_gpus
        try:  # an interrupt at any point, during Ray's start too: close() ends the whole cluster
            self.cluster = runner.LocalRayCluster(num_cpus=max(2, gpus), num_gpus=gpus)
            with signals.held():  # Ray's core worker takes SIGTERM over while it connects
                ray.init(address=self.cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                         configure_logging=False,
                         runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}})  # fmt: skip
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
                # the cluster's own process and temp folder: close() ends the one and removes the other
                "cluster": {"head_pid": self.cluster.proc.pid, "temp_dir": str(self.cluster.temp_dir)},
            }
        except BaseException:
            self.close()
            raise

    def _get(self, ref):
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (RunError, RlsmokeError, torch.OutOfMemoryError)):
                raise cause from None
            raise RunError(
                f"a Ray worker failed: {str(exc).strip().splitlines()[-1]}", rule="engine.worker"
            ) from None
        except self.ray.exceptions.RayActorError as exc:
            raise RunError(f"a Ray actor died: {str(exc).splitlines()[0]}", rule="engine.worker") from None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._get(self.train.manual_seed.remote(seed))  # the rollout engine draws from its own generators

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
        return self._get(self.rollout.sync.remote(weights, skip=skip))

    def drop_optimizer_state(self) -> None:
        self._get(self.train.drop_optimizer_state.remote())

    def move_seconds(self) -> dict[str, float]:
        return {}  # the trainer and the rollout engine have devices of their own: nothing moves

    def parallel(self) -> dict:
        return executed_layout(dp=1)

    def keep_initial(self) -> None:
        self._get(self.train.keep_initial.remote())
        self._get(self.rollout.keep_initial.remote(self.train.weights.remote()))

    def restore_initial(self) -> None:
        self._get(self.train.restore_initial.remote())
        self._get(self.rollout.restore_initial.remote(self.train.weights.remote()))

    def set_variant(self, inject, temperature: float) -> None:
        # each actor's fault lives in its own process: `rlsmoke run --variants` refuses async before loading
        raise RlsmokeError("mode=async runs one variant per load", rule="run.variants_async",
                           fix="run the variants colocated (--mode colocate), or one `rlsmoke run --inject` each")  # fmt: skip

    def close(self) -> None:
        """The driver leaves, then every process of the cluster ends (actors, raylet, agents, GCS)."""
        try:
            if self.ray.is_initialized():
                with signals.held():  # Ray's shutdown resets SIGTERM to its default (death)
                    self.ray.shutdown()
        finally:
            if self.cluster is not None:
                self.cluster.stop()
                self.cluster = None


def train_worker(cfg: RunConfig, ckpt: Path) -> TrainSide:
    if cfg.trainer == "megatron":
        from rlsmoke.engine.megatron.trainer import MegatronTrainWorker

        return MegatronTrainWorker(cfg, ckpt)
    return TrainWorker(cfg, ckpt)


def open_workers(cfg: RunConfig, ckpt: Path, eos_id: int, pad_id: int) -> Placement:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.mode == "async":
        return RayAsync(cfg, ckpt, eos_id, pad_id)
    if cfg.num_gpus > 1:
        from rlsmoke.engine.sharded import Sharded  # FSDP2 over the actor GPUs, one process per rank

        return Sharded(cfg, ckpt, eos_id, pad_id)
    return Colocated(cfg, ckpt, eos_id, pad_id)
