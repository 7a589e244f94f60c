"""The one decided plan of a run: `resolve(case, session) -> RunConfig`, before anything loads. No torch.
`plan_for` and `shortfall` read the same defaults, so the suite's skip and `rlsmoke run` agree."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from rlsmoke import residency
from rlsmoke.cases import Case
from rlsmoke.engine import limits
from rlsmoke.engine.config import (
    BUILTIN_ASYNC_GPUS,
    BUILTIN_METRICS,
    RunConfig,
    Variant,
    dtype_name,
    parse_inject,
)
from rlsmoke.engine.data import prompt_rows
from rlsmoke.errors import RlsmokeError
from rlsmoke.facts import DEFAULT_REWARD, DEFAULT_TRAINER, GPU_PLATFORMS
from rlsmoke.memory import GIB, Plan, estimate, plan_of_run
from rlsmoke.models import ONE_GPU_VARIANT
from rlsmoke.platforms import DEVICE_MEMORY_GIB, Host, detect, get_platform
from rlsmoke.recipe import BatchShape
from rlsmoke.runkey import default_dtype
from rlsmoke.thresholds import calibrated_decode, check_thresholds
from rlsmoke.topology import plan_topology


@dataclass(frozen=True)
class Session:
    """The host and the engine's options beside the case; None: `resolve` decides."""

    host: Host | None = None  # None: detected (a CPU run needs none)
    trainer: str = DEFAULT_TRAINER
    launcher: str | None = None  # the thresholds key's launcher: builtin, or builtin-megatron
    gated: bool = True  # the run's gates are checked after it (not --records-only): its thresholds must load
    seed: int = 0
    repeat: int = 1
    variants: tuple[Variant, ...] = ()  # several runs on one load, each from the initial weights
    rollout_dtype: str | None = None  # float32 on CPU, bfloat16 on GPUs (runkey.default_dtype)
    train_dtype: str = "float32"
    compute_dtype: str | None = None
    compute_path: str = "params"
    rollout_temperature: float = 1.0
    inject: str | None = None
    num_rollout: int = 2
    n_prompts: int | None = None  # None: BatchShape.for_platform's
    n_samples: int | None = None
    max_response_len: int | None = None
    rollout_batch: str = "auto"
    rollout_decode: str = "auto"
    reward: str = DEFAULT_REWARD
    gradient_checkpointing: bool = False
    offload: bool | None = None  # None: residency.offload_needed (facts.OFFLOAD_DEFAULT)
    offload_train: bool | None = None  # None: residency.offload_train_needed
    checkpoint: Path | None = None
    prompt_data: Path | None = None


def effective_case(case: Case, gpus: int | None) -> Case:
    """The case at the session's GPU count; on one GPU its `ONE_GPU_VARIANT` when the full width won't fit."""
    if case.platform not in GPU_PLATFORMS:
        return case
    if gpus is not None and case.num_gpus != gpus:
        case = dataclasses.replace(case, num_gpus=gpus)
    if case.num_gpus == 1 and case.name in ONE_GPU_VARIANT and not case.tiny:
        case = dataclasses.replace(case, name=ONE_GPU_VARIANT[case.name])
    return case


def _given(value: int | None, default: int) -> int:
    return default if value is None else value  # a flag given as 0 is refused by validate(), never replaced


def _defaults(case: Case, session: Session, host: Host, *, validate: bool = True) -> RunConfig:
    """`case`'s RunConfig on `host`, every default but the memory policy; `validate=False` refuses nothing."""
    platform = get_platform(case.platform)
    topo = plan_topology(case.spec(), platform.name, case.num_gpus, case.mode, dict(case.overrides),
                         gpus_per_node=case.gpus_per_node, target=case.target, validate=validate)  # fmt: skip
    one_each = (topo.actor_gpus, topo.rollout_gpus) == (1, BUILTIN_ASYNC_GPUS - 1)
    if validate and topo.mode == "async" and not one_each:
        raise RlsmokeError(f"mode=async with {topo.actor_gpus} train + {topo.rollout_gpus} rollout GPUs: the built-in "
                           "engine places one trainer and one rollout engine", rule="engine.placement",
                           fix=f"use --mode async --num-gpus {BUILTIN_ASYNC_GPUS}")  # fmt: skip
    if validate and platform.name != "cpu" and (host.platform != platform.name or host.count < topo.num_gpus):
        raise RlsmokeError(f"num_gpus={topo.num_gpus} on platform={platform.name}, but this host has {host.describe()}",
                           rule="engine.gpus", fix="ask for at most the visible GPUs, or run --platform cpu")  # fmt: skip
    s, shape = session, BatchShape.for_platform(platform.name)
    return RunConfig(
        case=case.name, tiny=case.tiny, platform=platform.name, device=platform.torch_device,
        device_class="CPU" if platform.name == "cpu" else host.device, num_gpus=topo.num_gpus, mode=topo.mode,
        seed=s.seed, rollout_dtype=dtype_name(s.rollout_dtype or default_dtype(platform.name).split("/")[0],
                                              "--rollout-dtype"),
        train_dtype=dtype_name(s.train_dtype, "--train-dtype"), rollout_temperature=s.rollout_temperature,
        compute_dtype=dtype_name(s.compute_dtype, "--compute-dtype") if s.compute_dtype else None,
        inject=parse_inject(s.inject), num_rollout=s.num_rollout,
        n_prompts=_given(s.n_prompts, shape.n_prompts(topo.mode, topo.num_gpus)),
        n_samples=_given(s.n_samples, shape.n_samples),
        max_response_len=_given(s.max_response_len, shape.max_response_len), reward=s.reward,
        compute_path=s.compute_path, gradient_checkpointing=s.gradient_checkpointing, offload=s.offload,
        offload_train=s.offload_train, checkpoint=s.checkpoint,
        launcher=s.launcher or ("builtin-megatron" if s.trainer == "megatron" else "builtin"),
        trainer=s.trainer, rollout_batch=s.rollout_batch, rollout_decode=s.rollout_decode,
        prompt_data=s.prompt_data or RunConfig.prompt_data,  # the field's default: the shipped prompts
    )  # fmt: skip


def auto_decode(cfg: RunConfig) -> str:
    """`--rollout-decode auto`: on NVIDIA GPUs the static decode, unless the run's thresholds were calibrated
    from `generate`, in whole or in part (a run whose static calls fell back records both); `generate` on CPU
    and ROCm, where static was never measured."""
    if cfg.platform != "nvidia":
        return "generate"
    return "static" if calibrated_decode(cfg.run_key) in (None, "static") else "generate"


def resolve(case: Case, session: Session = Session()) -> RunConfig:
    """The run of `case` under `session`, decided and validated before anything heavy is imported."""
    host = Host("cpu", "CPU", 0) if case.platform == "cpu" else session.host or detect()
    cfg = _defaults(case, session, host)
    if session.repeat < 1:
        raise RlsmokeError(f"repeat={session.repeat} must be >= 1", rule="run.config", fix="adjust --repeat")
    cfg.validate()  # the trainer's refusal (megatron) with every other bad combination
    limits.check_numbers(cfg, repeat=session.repeat)
    # read again by the run: a bad file is refused here, not there
    prompt_rows(cfg.prompt_data, cfg.n_prompts)
    longest = limits.longest_prompt(cfg.prompt_data, cfg.checkpoint)
    limits.check_context(cfg, longest, limits.context_limits(cfg.spec, cfg.checkpoint))
    if cfg.platform == "cpu":
        limits.check_host_memory(cfg, longest.tokens)
    if session.gated:  # gated after the run: a broken thresholds file is refused before it
        check_thresholds(cfg.run_key, BUILTIN_METRICS)
    if cfg.rollout_decode == "auto":
        cfg = cfg.replace(rollout_decode=auto_decode(cfg))
    cfg = cfg.replace(longest_prompt=longest.tokens)
    if cfg.platform != "cpu":  # the offload where not asked for; where --repeat and --variants keep weights
        if cfg.offload is None:
            cfg = cfg.replace(offload=residency.offload_needed(cfg))
            if cfg.offload and cfg.offload_train is None:
                cfg = cfg.replace(offload_train=residency.offload_train_needed(cfg))
        if session.repeat > 1 or session.variants:  # each further run starts from weights kept after the load
            cfg = cfg.replace(initial_on_device=residency.initial_on_device(cfg))
        residency.check_run_fits(cfg, prompt_tokens=longest.tokens)  # refused here, not by an OOM
    if cfg.offload_train is not None and not cfg.offload_active:  # it would be ignored
        flag = "--offload-train" if cfg.offload_train else "--no-offload-train"
        raise RlsmokeError(f"{flag} with the colocate offload off for this run (mode={cfg.mode}, "
                           f"platform={cfg.platform})", rule="run.offload_train",
                           fix=f"add --offload (colocate), or drop {flag}")  # fmt: skip
    return cfg


def resolve_variants(case: Case, session: Session) -> list[RunConfig]:
    """--variants: each variant's RunConfig, validated as a run with its fault and temperature would be."""
    if session.inject:
        raise RlsmokeError(f"--inject {session.inject} with --variants", rule="run.variants",
                           fix="drop --inject: a fault goes into --variants (clean,stale-weights,...)")  # fmt: skip
    if session.repeat != 1:
        raise RlsmokeError(f"--repeat {session.repeat} with --variants: both restore the initial weights between "
                           "runs, each for its own", rule="run.variants_repeat",
                           fix="run the variants at one seed, or the repeat without --variants")  # fmt: skip
    base = resolve(case, session)
    if base.mode == "async":
        raise RlsmokeError("--variants with mode=async: each Ray actor holds its side's fault in its own process",
                           rule="run.variants_async",
                           fix="run the variants colocated (--mode colocate), or one `rlsmoke run --inject` each")  # fmt: skip
    cfgs = []
    for variant in session.variants:
        cfg = base.replace(inject=variant.inject, rollout_temperature=variant.rollout_temperature)
        try:
            cfg.validate()
            limits.check_numbers(cfg, repeat=1)
        except RlsmokeError as exc:
            raise RlsmokeError(f"variant {variant}: {exc}", rule=exc.rule,
                               fix=exc.fix or "change that variant in --variants (FAULT@T sets its rollout "
                                              "temperature, e.g. temperature-mismatch@0.8)") from None  # fmt: skip
        cfgs.append(cfg)
    return cfgs


def plan_for(case: Case, *, host: Host | None = None, **changes) -> Plan:
    """The memory plan of the run `resolve` decides, before the offload policy; `changes` replace fields."""
    host = host or Host(case.platform, "GPU", case.num_gpus)
    plan = plan_of_run(_defaults(case, Session(), host, validate=False))
    return dataclasses.replace(plan, **{k: v for k, v in changes.items() if v is not None})


def shortfall(case: Case, host: Host) -> str:
    """Why a full-width GPU case cannot fit this host's devices ("" when it fits), as a skip reason."""
    have = DEVICE_MEMORY_GIB.get(host.device, 0)
    if case.platform not in GPU_PLATFORMS or case.tiny or not have:
        return ""
    est = estimate(case.spec(), plan_for(case, host=host))
    if est.peak <= residency.usable_gib(host.device) * GIB:
        return ""
    gpus = f"{case.num_gpus} GPU{'s' if case.num_gpus > 1 else ''}"
    return (f"needs {est.describe()} for {case.name} over {gpus}; {host.describe()} has {have} GiB each "
            f"({residency.usable_gib(host.device):.0f} usable). Run with more GPUs (--num-gpus)")  # fmt: skip
