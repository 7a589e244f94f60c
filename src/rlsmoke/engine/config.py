"""What one engine run is: a frozen, validated config. No torch here."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.engine import megatron
from rlsmoke.errors import RlsmokeError, require_known
from rlsmoke.facts import (
    CPU_MAX_RESPONSE_LEN,
    CPU_N_PROMPTS,
    CPU_N_SAMPLES,
    DEFAULT_REWARD,
    DEFAULT_TRAINER,
    FAULTS,
    REWARDS,
    TRAINERS,
)
from rlsmoke.models import ModelSpec, model_spec
from rlsmoke.recipe import SEED_RECIPE
from rlsmoke.runkey import RunKey, gpu_count
from rlsmoke.shipped import FIXTURES

# The built-in async placement is one trainer plus one rollout engine.
BUILTIN_ASYNC_GPUS = 2
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
COMPUTE_PATHS = ("params", "autocast")
# The rollout's generate calls (engine.rollout.batch_for)
ROLLOUT_BATCHES = ("auto", "group", "rank", "length")
# The rollout's decode (engine.decode): generate, transformers' own; static, a static KV cache and CUDA graphs;
# auto (the CLI's and the suite's), what `rlsmoke.resolve.auto_decode` decides
ROLLOUT_DECODES = ("auto", "generate", "static")
# name -> whether it takes a value (`rollout-noise=0.01`)
INJECTIONS = {name: value is not None for name, value in FAULTS.items()}
# Every metric the built-in engine logs, and the one `metrics.Record` derives: a gate on any other is refused.
BUILTIN_METRICS = frozenset({
    "rollout/raw_reward", "rollout/log_probs", "rollout/rollout_log_probs", "rollout/entropy", "rollout/response_len",
    "rollout/logprob_mean_diff",
    "train/train_rollout_logprob_abs_diff", "train/train_rollout_logprob_abs_diff_max", "train/train_rollout_kl",
    "train/train_rollout_logprob_slope", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/entropy_loss",
    "train/kl_loss", "train/loss", "train/grad_norm", "train/lr", "train/updated_params_frac",
    "sync/checked_params", "sync/mismatched_params", "sync/max_abs_diff", "sync/ranks",
})  # fmt: skip


def executed_layout(*, dp: int) -> dict:
    """summary.json's `parallel` for the HF trainer: data parallel only (FSDP2 shards, never splits a layer)."""
    return {"tp": 1, "ep": 1, "pp": 1, "cp": 1, "dp": dp, "sp": False}


@dataclass(frozen=True)
class Inject:
    kind: str = ""  # "" means no fault
    value: float = 0.0

    @property
    def skips_sync(self) -> bool:
        """stale-weights: the sync loads nothing and compares the rollout copy as it was."""
        return self.kind == "stale-weights"

    def __str__(self) -> str:
        if not self.kind:
            return "none"
        return f"{self.kind}={self.value:g}" if INJECTIONS[self.kind] else self.kind


def parse_inject(text: str | None) -> Inject:
    if not text:
        return Inject()
    name, _, value = text.partition("=")
    if name not in INJECTIONS:
        raise RlsmokeError(
            f"inject={text!r} is unknown",
            rule="inject.known",
            fix=f"use one of: {', '.join(k + ('=VALUE' if v else '') for k, v in INJECTIONS.items())}",
        )
    if INJECTIONS[name] != bool(value):
        raise RlsmokeError(
            f"inject={text!r} {'needs a' if INJECTIONS[name] else 'takes no'} value",
            rule="inject.value",
            fix=f"write --inject {name}{'=0.01' if INJECTIONS[name] else ''}",
        )
    try:
        return Inject(name, float(value) if value else 0.0)
    except ValueError:
        raise RlsmokeError(
            f"inject={text!r} has a value that is not a number",
            rule="inject.value",
            fix=f"write --inject {name}=0.01",
        ) from None


@dataclass(frozen=True)
class Variant:
    """One run of `rlsmoke run --variants`: a fault (or none) and the rollout temperature it samples at."""

    inject: Inject
    rollout_temperature: float

    @property
    def fault(self) -> str:
        return str(self.inject) if self.inject.kind else "clean"

    @property
    def slug(self) -> str:
        """Its run folder's name under --out: `clean`, `train-dropout-0.1`, `temperature-mismatch-t0.8`."""
        at = f"@t{self.rollout_temperature:g}" if self.rollout_temperature != 1.0 else ""
        return re.sub(r"[^A-Za-z0-9._]+", "-", self.fault + at)

    def __str__(self) -> str:
        return f"{self.fault}@{self.rollout_temperature:g}"


def parse_variants(text: str, temperature: float) -> list[Variant]:
    """`--variants clean,stale-weights,temperature-mismatch@0.8`: --inject's faults, `@T` a temperature."""
    fix = "write --variants as comma-separated faults, e.g. clean,stale-weights,temperature-mismatch@0.8"
    variants = []
    for item in text.split(","):
        fault, at, temp = item.strip().partition("@")
        if not fault:
            raise RlsmokeError(f"--variants {text!r} has an empty variant", rule="run.variants", fix=fix)
        try:
            t = float(temp) if at else temperature
        except ValueError:
            raise RlsmokeError(f"variant {item.strip()!r}: temperature {temp!r} is not a number", rule="run.variants",
                               fix="write FAULT@T, e.g. temperature-mismatch@0.8") from None  # fmt: skip
        inject = Inject() if fault == "clean" else parse_inject(fault)
        if inject.kind.startswith("bridge-"):
            raise RlsmokeError(f"variant {fault!r} is a bridge defect, built into the trainer's weights as it loads: "
                               "the loaded workers cannot switch it on or off", rule="run.variants",
                               fix=f"run it alone: --inject {fault}")  # fmt: skip
        variant = Variant(inject, t)
        if any(v.slug == variant.slug for v in variants):
            raise RlsmokeError(
                f"--variants names {variant} twice", rule="run.variants", fix="name each variant once"
            )
        variants.append(variant)
    return variants


def dtype_name(text: str, flag: str) -> str:
    name = DTYPE_ALIASES.get(text, text)
    require_known(flag, name, DTYPES, rule="dtype.known")
    return name


@dataclass(frozen=True)
class RunConfig:
    case: str
    tiny: bool
    platform: str = "cpu"
    device: str = "cpu"  # torch device of the trainer (and of the rollout engine when colocated)
    device_class: str = "CPU"  # the thresholds key: "CPU", "H200", ...
    num_gpus: int = 1
    mode: str = "colocate"  # colocate: one process; async: Ray actors on separate bundles
    seed: int = 0
    rollout_dtype: str = "float32"
    train_dtype: str = "float32"  # the master weights and the optimizer state
    rollout_temperature: float = 1.0
    inject: Inject = field(default_factory=Inject)
    num_rollout: int = 2  # the last rollout is scored, not trained on: it gates the post-sync drift
    n_prompts: int = CPU_N_PROMPTS  # a GPU run's are seed 004's (`rlsmoke.resolve`)
    n_samples: int = CPU_N_SAMPLES
    max_response_len: int = CPU_MAX_RESPONSE_LEN
    reward: str = DEFAULT_REWARD  # a random-weight model scores 0 on math, which leaves GRPO no signal
    lr: float = SEED_RECIPE.lr
    betas: tuple[float, float] = SEED_RECIPE.adam_betas
    weight_decay: float = SEED_RECIPE.weight_decay
    grad_clip: float = 1.0
    eps_clip: float = SEED_RECIPE.eps_clip
    eps_clip_high: float = SEED_RECIPE.eps_clip_high
    kl_coef: float = SEED_RECIPE.kl_coef
    entropy_coef: float = SEED_RECIPE.entropy_coef
    gradient_checkpointing: bool = False
    # None: the rollout dtype on a GPU (as Megatron's bf16 training), the master dtype on CPU
    compute_dtype: str | None = None
    # "params": a compute-dtype copy over fp32 main params (Megatron's bf16); "autocast" measured 5-10x
    # noisier against a bf16 rollout (docs/calibration.md)
    compute_path: str = "params"
    # Miles' --colocate offload; None: on for GPU colocate (`rlsmoke.resolve` decides)
    offload: bool | None = None
    # Miles' --offload-train beside --offload-rollout; None: yes, until `rlsmoke.resolve` decides
    offload_train: bool | None = None
    # --repeat/--variants' initial weights on the device when the estimate has room (engine.reuse)
    initial_on_device: bool = False
    checkpoint: Path | None = None  # None: `rlsmoke.checkpoints.prepare` builds (or reuses) it
    prompt_data: Path = FIXTURES / "data" / "math.jsonl"
    launcher: str = "builtin"
    trainer: str = DEFAULT_TRAINER
    # auto: a rank's groups in one generate call on a GPU, one call per group on CPU (engine.rollout.batch_for)
    rollout_batch: str = "auto"
    # `rlsmoke.resolve.auto_decode` decides `auto`: the decode the run's thresholds were calibrated from
    rollout_decode: str = "generate"
    # the prompt file's longest prompt in tokens (resolve's), which sizes the static decode's one cache length
    longest_prompt: int = 0

    @functools.cached_property
    def spec(self) -> ModelSpec:
        """The case's model, resolved once: the workers receive it with the config."""
        return model_spec(self.case, tiny=self.tiny)

    def __getstate__(self) -> dict:
        # a spec's frozen mappings do not pickle: a rank process or a Ray actor resolves its own, once
        return {k: v for k, v in self.__dict__.items() if k != "spec"}

    @property
    def train_compute_dtype(self) -> str:
        if self.compute_dtype:
            return self.compute_dtype
        return self.rollout_dtype if self.device.startswith("cuda") else self.train_dtype

    @property
    def separate_compute_copy(self) -> bool:
        return self.compute_path == "params" and self.train_compute_dtype != self.train_dtype

    @property
    def offload_active(self) -> bool:
        if self.mode != "colocate":
            return False  # async: the trainer and the rollout engine never share a device
        return self.device.startswith("cuda") if self.offload is None else self.offload

    @property
    def offload_train_active(self) -> bool:
        return self.offload_active and self.offload_train is not False

    @property
    def dtype_key(self) -> str:
        return f"{self.rollout_dtype}/{self.train_dtype}"

    @property
    def run_key(self) -> RunKey:
        return RunKey(self.case, self.platform, self.device_class, self.launcher, self.dtype_key,
                      "tiny" if self.tiny else "full", gpu_count(self.num_gpus))  # fmt: skip

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Every bad combination, named with its flags, before anything is loaded."""
        problems = []
        if self.num_rollout < 1:
            problems.append(f"num_rollout={self.num_rollout} must be >= 1. Adjust --num-rollout")
        if self.n_samples < 2:
            problems.append(
                f"n_samples={self.n_samples} leaves GRPO no group to normalize. Adjust --n-samples"
            )
        if self.n_prompts < 1 or self.max_response_len < 1:
            problems.append(
                "n_prompts and max_response_len must be >= 1. Adjust --n-prompts, --max-response-len"
            )
        if self.rollout_temperature <= 0:
            problems.append(
                f"rollout_temperature={self.rollout_temperature} must be > 0. Adjust --rollout-temperature"
            )
        for name, known in (("compute_path", COMPUTE_PATHS), ("rollout_batch", ROLLOUT_BATCHES),
                            ("rollout_decode", ROLLOUT_DECODES), ("reward", REWARDS),
                            ("trainer", TRAINERS)):  # fmt: skip
            if (value := getattr(self, name)) not in known:
                flag = "--" + name.replace("_", "-")
                problems.append(f"{name}={value!r} is unknown ({', '.join(known)}). Adjust {flag}")
        if self.inject.kind == "temperature-mismatch" and self.rollout_temperature == 1.0:
            problems.append(
                "inject=temperature-mismatch changes nothing at rollout_temperature=1. "
                "Adjust --rollout-temperature (seed 000 samples at 0.8)"
            )
        if self.inject.kind == "rollout-noise" and self.inject.value <= 0:
            problems.append("inject=rollout-noise needs SIGMA > 0. Adjust --inject rollout-noise=0.01")
        if self.inject.skips_sync and self.num_rollout < 2:
            problems.append("inject=stale-weights needs a sync, so num_rollout >= 2. Adjust --num-rollout")
        if self.inject.kind.startswith("bridge-") and self.trainer != "megatron":
            problems.append(f"inject={self.inject.kind} is a bridge defect: it needs --trainer megatron")
        why = megatron.refusal(self.spec, self.num_gpus, self.mode) or megatron.unwired(
            inject=str(self.inject), gradient_checkpointing=self.gradient_checkpointing, kl_coef=self.kl_coef
        )
        if self.trainer == "megatron" and why:
            problems.append(
                f"trainer=megatron: {why}. Adjust --trainer fsdp, or --mode colocate --num-gpus 1"
            )
        if problems:
            raise RlsmokeError("; ".join(problems), rule="run.config")
