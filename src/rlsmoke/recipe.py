"""The seeds' one-step recipe: GRPO, AdamW and rollout settings that are not topology, for Miles' flags
and the built-in engine alike."""

from __future__ import annotations

from dataclasses import dataclass

from rlsmoke.errors import require_known
from rlsmoke.facts import CPU_MAX_RESPONSE_LEN, CPU_N_PROMPTS, CPU_N_SAMPLES, DEFAULT_REWARD, REWARDS


@dataclass(frozen=True)
class Recipe:
    num_rollout: int = 3
    rollout_batch_size: int = 8
    n_samples_per_prompt: int = 8
    rollout_max_response_len: int = 100
    rollout_temperature: float = 1.0
    max_tokens_per_gpu: int = 2048
    # GRPO and AdamW, as every seed sets them; the built-in engine's defaults read these too.
    lr: float = 1e-6
    adam_betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    sglang_mem_fraction: float = 0.70
    update_weights_interval: int = 2  # async only
    # env, not argv; None: loopback on one node (`launch.miles.head_addr`)
    master_addr: str | None = None
    prompt_file: str = "dapo-math-17k/dapo-math-17k.jsonl"
    # "target" makes grad_norm > 0 a signal; under "deepscaler" a 4-layer model earns 0 everywhere
    reward: str = DEFAULT_REWARD

    def __post_init__(self):
        require_known("reward", self.reward, REWARDS, rule="recipe.reward")

    @property
    def global_batch_size(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt


SEED_RECIPE = Recipe()


@dataclass(frozen=True)
class BatchShape:
    """The per-rollout shape a run defaults to on a platform."""

    prompts: int
    n_samples: int
    max_response_len: int

    @classmethod
    def for_platform(cls, platform: str) -> BatchShape:
        if platform == "cpu":
            return cls(CPU_N_PROMPTS, CPU_N_SAMPLES, CPU_MAX_RESPONSE_LEN)
        # seed 004's per-rollout shape: what the GPU gates are calibrated on (docs/calibration.md)
        r = SEED_RECIPE
        return cls(r.rollout_batch_size, r.n_samples_per_prompt, r.rollout_max_response_len)

    def n_prompts(self, mode: str, num_gpus: int) -> int:
        """At least one prompt per data-parallel rank when colocated, rounded up to a multiple of them."""
        return max(num_gpus, -(-self.prompts // num_gpus) * num_gpus) if mode == "colocate" else self.prompts
