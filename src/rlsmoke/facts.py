"""Facts that more than one module reads, each said once. Literals only: no torch, nothing of the package."""

from __future__ import annotations

VERSION = "0.1.0"  # the package's; pyproject.toml's `version` says the same (tests/unit/test_packaging.py)

# --- where a case runs ---------------------------------------------------------------------------

PLATFORMS = ("nvidia", "rocm", "cpu")
GPU_PLATFORMS = ("nvidia", "rocm")
MODES = ("colocate", "async")
# Seed 004: colocate on NVIDIA, async on ROCm; on CPU the run is one process.
DEFAULT_MODE = {"nvidia": "colocate", "rocm": "async", "cpu": "colocate"}
DEFAULT_GPUS_PER_NODE = 8


def in_words(by_platform: dict, shown=str) -> str:
    """A value per platform in words, for help text: "colocate on nvidia and cpu, async on rocm"."""
    platforms: dict[object, list[str]] = {}
    for platform, value in by_platform.items():
        platforms.setdefault(value, []).append(platform)
    return ", ".join(f"{shown(value)} on {' and '.join(names)}" for value, names in platforms.items())


# --- the built-in engine -------------------------------------------------------------------------

# HF modeling code (FSDP2 over several GPUs) | megatron-core's GPTModel, loaded and synced through the bridge
TRAINERS = ("fsdp", "megatron")
DEFAULT_TRAINER = "fsdp"

# "target": rlsmoke's dense reward, so an untrained group has reward variance; "deepscaler": Miles' 0/1 math.
REWARDS = ("target", "deepscaler")
DEFAULT_REWARD = "target"

# --inject's faults: name -> its value's metavar (None: none). bridge-* need the megatron trainer.
FAULTS: dict[str, str | None] = {
    "temperature-mismatch": None,
    "stale-weights": None,
    "rollout-noise": "SIGMA",
    "train-dropout": "P",
    "bridge-kv-order": None,
    "bridge-expert-swap": None,
    "bridge-gate-up-order": None,
}


def faults_text() -> str:
    """FAULTS as --inject's help writes them: `stale-weights | rollout-noise=SIGMA | ...`."""
    return " | ".join(name + (f"={value}" if value else "") for name, value in FAULTS.items())


# The per-rollout batch on CPU keeps a tiny case seconds long on 2 cores; GPUs take seed 004's.
CPU_N_PROMPTS = 2
CPU_N_SAMPLES = 4
CPU_MAX_RESPONSE_LEN = 16

# A colocated GPU run skips the offload only within this fraction of the device: the estimate counts
# allocated bytes, not fragmentation.
RESIDENT_FRACTION = 0.8
OFFLOAD_DEFAULT = (
    f"on for a colocated GPU run, unless it is on one device and fits resident in {RESIDENT_FRACTION:.0%} of it; "
    "off on CPU and in async mode, where it frees nothing"
)

# How long the suite lets one run take before it stops it, by platform (seconds).
RUN_TIMEOUT_S = {"cpu": 900.0, "nvidia": 3600.0, "rocm": 3600.0}
# threads making a synthesized checkpoint's chunks at most (checkpoints.shards.write_shards)
SYNTHESIS_THREADS = 4

# --- the modeling code ---------------------------------------------------------------------------

# preloaded so an interrupt never lands mid-import
TOKENIZER_MODULE = "transformers.models.auto.tokenization_auto"


def modeling_module(hf_model_type: str) -> str:
    return f"transformers.models.{hf_model_type}.modeling_{hf_model_type}"
