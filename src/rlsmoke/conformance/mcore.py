"""megatron-core 0.16.1's TransformerConfig / MLATransformerConfig on a plan's training grid and model shape.

The config is built from the rendered Megatron flags by the rule Megatron-LM's
`core_transformer_config_from_args` follows: a flag `--foo-bar` sets the field `foo_bar`; `FIELDS`
lists the ones read (grid, shape, MoE, MLA, recompute) and `RENAMED` the few whose Megatron-LM
destination differs. `pipeline_dtype` is the params dtype (bf16), as Megatron-LM always passes it.
`__post_init__` checks heads and query groups against TP, PP without a pipeline dtype, recompute and
MoE settings. It does not check EP against the experts nor the world size: Megatron-LM's
`validate_args` does, in the Miles check. `moe_permute_fusion` is left off: constructing it needs
TransformerEngine, a library fact, not a topology one. Runs in the megatron-core venv.
"""

from __future__ import annotations

import ast

from rlsmoke.conformance._capture import run_validator
from rlsmoke.conformance.verdict import Verdict, flag_value

PARSER = "mcore"

# field -> converter (MLA's below); the flag is `--` + the field with dashes. Booleans are store_true flags.
FIELDS = {
    # training grid
    "tensor_model_parallel_size": int,
    "pipeline_model_parallel_size": int,
    "context_parallel_size": int,
    "expert_model_parallel_size": int,
    "expert_tensor_parallel_size": int,
    "sequence_parallel": bool,
    "num_layers_in_first_pipeline_stage": int,
    "num_layers_in_last_pipeline_stage": int,
    # shape
    "num_layers": int,
    "hidden_size": int,
    "ffn_hidden_size": int,
    "num_attention_heads": int,
    "kv_channels": int,
    "qk_layernorm": bool,
    "add_qkv_bias": bool,
    "normalization": str,
    # MoE
    "moe_router_topk": int,
    "moe_ffn_hidden_size": int,
    "moe_shared_expert_intermediate_size": int,
    "moe_router_score_function": str,
    "moe_router_pre_softmax": bool,
    "moe_router_enable_expert_bias": bool,
    "moe_router_topk_scaling_factor": float,
    "moe_router_load_balancing_type": str,
    "moe_aux_loss_coeff": float,
    "moe_router_dtype": str,
    "moe_token_dispatcher_type": str,
    "moe_grouped_gemm": bool,
    "moe_enable_deepep": bool,
    # recompute
    "recompute_granularity": str,
    "recompute_method": str,
    "recompute_num_layers": int,
}
MLA_FIELDS = {  # MLATransformerConfig only
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "qk_head_dim": int,
    "v_head_dim": int,
    "qk_pos_emb_head_dim": int,
    "rotary_base": float,
}
# Megatron-LM flag -> (field, value when present, or None to read the flag's value)
RENAMED = {
    "--num-experts": ("num_moe_experts", None),
    "--decoder-first-pipeline-num-layers": ("num_layers_in_first_pipeline_stage", None),
    "--decoder-last-pipeline-num-layers": ("num_layers_in_last_pipeline_stage", None),
    "--swiglu": ("gated_linear_unit", True),
    "--disable-bias-linear": ("add_bias_linear", False),
}
NOT_CONSTRUCTED = ("moe_permute_fusion",)


def load() -> None:
    import megatron.core.transformer.transformer_config  # noqa: F401


def _moe_layer_freq(expr: str) -> int | list[int]:
    """Megatron-LM's `--moe-layer-freq`: an int, or a list expression such as `[0]*3+[1]*1`."""
    tree = ast.parse(expr, mode="eval").body

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Add):
            left, right = ev(node.left), ev(node.right)
            return left * right if isinstance(node.op, ast.Mult) else left + right
        raise ValueError(f"--moe-layer-freq={expr!r} is not an int or a list expression")

    return ev(tree)


def config_kwargs(argv: list[str], *, mla: bool) -> dict:
    """TransformerConfig kwargs from the rendered Megatron flags (see the module docstring for the rule)."""
    import torch

    kwargs: dict = {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    for field, convert in (FIELDS | MLA_FIELDS if mla else FIELDS).items():
        flag = "--" + field.replace("_", "-")
        if convert is bool:
            if flag in argv:
                kwargs[field] = True
        elif (value := flag_value(argv, flag)) is not None:
            kwargs[field] = convert(value)
    for flag, (field, const) in RENAMED.items():
        if const is not None:
            if flag in argv:
                kwargs[field] = const
        elif (value := flag_value(argv, flag)) is not None:
            kwargs[field] = int(value)
    if "--group-query-attention" in argv:
        kwargs["num_query_groups"] = int(flag_value(argv, "--num-query-groups"))
    if (freq := flag_value(argv, "--moe-layer-freq")) is not None:
        kwargs["moe_layer_freq"] = _moe_layer_freq(freq)
    if kwargs.get("gated_linear_unit"):
        kwargs["activation_func"] = torch.nn.functional.silu
    return kwargs


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
