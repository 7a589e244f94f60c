"""megatron-core 0.16.1's TransformerConfig / MLATransformerConfig on a plan's training grid and model shape.

The config is built from the rendered Megatron flags by Megatron-LM's rule (`engine.megatron.flags`).
`__post_init__` checks heads and query groups against TP, PP without a pipeline dtype, recompute and
MoE settings. It does not check EP against the experts nor the world size: Megatron-LM's
`validate_args` does, in the Miles check. `moe_permute_fusion` is left off: constructing it needs
TransformerEngine, a library fact, not a topology one. Runs in the megatron-core venv.
"""

from __future__ import annotations

from rlsmoke.conformance._capture import run_validator
from rlsmoke.conformance.verdict import Verdict
from rlsmoke.engine.megatron.flags import config_kwargs

PARSER = "mcore"
NOT_CONSTRUCTED = ("moe_permute_fusion",)


def load() -> None:
    import megatron.core.transformer.transformer_config  # noqa: F401


def check(plan: dict) -> Verdict:
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    argv = list(plan["argv"])
    mla = "--multi-latent-attention" in argv
    cls = MLATransformerConfig if mla else TransformerConfig
    kwargs = config_kwargs(argv, mla=mla)

    def construct() -> str:
        cls(**kwargs)
        grid = ", ".join(
            f"{k.split('_')[0]}={kwargs.get(k, 1)}"
            for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                      "expert_model_parallel_size")
        )  # fmt: skip
        return f"{cls.__name__} accepted ({grid}; not constructed: {', '.join(NOT_CONSTRUCTED)})"

    return run_validator(PARSER, construct)
