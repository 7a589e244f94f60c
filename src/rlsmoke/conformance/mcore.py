"""megatron-core 0.16.1's TransformerConfig / MLATransformerConfig on a plan's training grid and model shape,
built by Megatron-LM's rule (`engine.megatron.flags`); EP and world size are the Miles check's. Runs in the
megatron-core venv."""

from __future__ import annotations

from rlsmoke.conformance.verdict import Verdict, run_validator
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
