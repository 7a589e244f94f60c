"""What a GPU run keeps on its devices, from the memory estimate before anything loads. No torch here."""

from __future__ import annotations

from dataclasses import replace

from rlsmoke.errors import RlsmokeError
from rlsmoke.facts import RESIDENT_FRACTION
from rlsmoke.memory import GIB, PROMPT_TOKENS, USABLE_FRACTION, Estimate, estimate, plan_of_run
from rlsmoke.platforms import DEVICE_MEMORY_GIB


def offload_needed(cfg) -> bool:
    """`--offload`'s default for a colocated GPU run: off only on one device that fits with room to spare,
    where the estimate has met the measured peak."""
    if cfg.mode != "colocate" or not cfg.device.startswith("cuda"):
        return False
    have = DEVICE_MEMORY_GIB.get(cfg.device_class, 0)
    if cfg.num_gpus > 1 or not have:
        return True
    return estimate(cfg.spec, replace(plan_of_run(cfg), offload=False)).peak > RESIDENT_FRACTION * have * GIB


def offload_train_needed(cfg) -> bool:
    """Whether the train state must leave for the rollout too: not when the rollout and sync fit beside it
    (GLM-4.5 4-layer on one H200 then moves 12 GiB a seed, not the master and moments)."""
    have = DEVICE_MEMORY_GIB.get(cfg.device_class, 0)
    if cfg.num_gpus > 1 or not have:
        return True  # FSDP2 ranks keep the whole offload until theirs is measured, as `offload_needed`
    copy_only = estimate(cfg.spec, replace(plan_of_run(cfg), offload=True, offload_train=False))
    return max(copy_only.phases["rollout"], copy_only.phases["sync"]) > RESIDENT_FRACTION * have * GIB


def initial_on_device(cfg) -> bool:
    """Keep --repeat's initial weights on the device when they fit: pinning GLM-5 4-layer's 11 GiB on the
    host took 14 s on an H200 host, a device copy milliseconds."""
    if not cfg.device.startswith("cuda") or not DEVICE_MEMORY_GIB.get(cfg.device_class, 0):
        return False
    with_copy = estimate(cfg.spec, replace(plan_of_run(cfg), initial_on_device=True))
    return with_copy.peak <= usable_gib(cfg.device_class) * GIB


def check_run_fits(cfg, *, prompt_tokens: int = PROMPT_TOKENS) -> Estimate:
    est = estimate(cfg.spec, replace(plan_of_run(cfg), prompt_len=max(PROMPT_TOKENS, prompt_tokens)))
    if (have := DEVICE_MEMORY_GIB.get(cfg.device_class, 0)) and est.peak > usable_gib(cfg.device_class) * GIB:
        hint = "" if cfg.offload_active or cfg.mode != "colocate" else "--offload, "
        raise RlsmokeError(
            f"case={cfg.case} needs {est.describe()} over {cfg.num_gpus} GPU(s); a {cfg.device_class} has "
            f"{have} GiB ({usable_gib(cfg.device_class):.0f} usable)", rule="memory.fits",
            fix=f"use {hint}more GPUs (--num-gpus), a smaller batch (--n-samples, --max-response-len), or --tiny",
        )  # fmt: skip
    return est


def usable_gib(device: str) -> float:
    return DEVICE_MEMORY_GIB.get(device, 0) * USABLE_FRACTION
