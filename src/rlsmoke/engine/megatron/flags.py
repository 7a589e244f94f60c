"""megatron-core TransformerConfig kwargs from rendered Megatron-LM flags, by the rule of Megatron-LM's
`core_transformer_config_from_args`: `--foo-bar` sets `foo_bar` (`FIELDS`), `RENAMED` the exceptions."""

from __future__ import annotations

import ast

# field -> converter; the flag is `--` + the field with dashes. Booleans are store_true flags.
FIELDS = {
    # training grid
    "tensor_model_parallel_size": int,
    "pipeline_model_parallel_size": int,
    "context_parallel_size": int,
    "expert_model_parallel_size": int,
    "expert_tensor_parallel_size": int,
    "sequence_parallel": bool,
    # shape
    "num_layers": int,
    "hidden_size": int,
    "ffn_hidden_size": int,
    "num_attention_heads": int,
    "kv_channels": int,
    "qk_layernorm": bool,
    "add_qkv_bias": bool,
    "normalization": str,
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
    "recompute_granularity": str,
    "recompute_method": str,
    "recompute_num_layers": int,
    # MLA (MLATransformerConfig only)
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "qk_head_dim": int,
    "v_head_dim": int,
    "qk_pos_emb_head_dim": int,
    "rotary_base": float,
}
MLA_ONLY = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "v_head_dim", "qk_pos_emb_head_dim", "rotary_base")
# Megatron-LM flag -> (field, converter of the flag's value, or the value a store_true flag sets)
RENAMED = {
    "--num-experts": ("num_moe_experts", int),
    "--decoder-first-pipeline-num-layers": ("num_layers_in_first_pipeline_stage", int),
    "--decoder-last-pipeline-num-layers": ("num_layers_in_last_pipeline_stage", int),
    "--swiglu": ("gated_linear_unit", True),
    "--disable-bias-linear": ("add_bias_linear", False),
}


def moe_layer_freq_value(expr: str) -> int | list[int]:
    """Megatron-LM's `--moe-layer-freq`: an int, or a list expression such as `[0]*3+[1]*1`."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Add):
            left, right = ev(node.left), ev(node.right)
            return left * right if isinstance(node.op, ast.Mult) else left + right
        raise ValueError(f"--moe-layer-freq={expr!r} is not an int or a list expression")

    return ev(ast.parse(expr, mode="eval").body)


def config_kwargs(argv: list[str], *, mla: bool) -> dict:
    """TransformerConfig kwargs from the rendered Megatron flags (see the module docstring for the rule)."""
    import torch

    kwargs: dict = {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    named = {
        "--" + field.replace("_", "-"): (field, True if convert is bool else convert)
        for field, convert in FIELDS.items()
        if mla or field not in MLA_ONLY
    }
    for flag, (field, convert) in (named | RENAMED).items():
        if not isinstance(convert, type):  # a store_true flag: the value it sets
            if flag in argv:
                kwargs[field] = convert
        elif (value := flag_value(argv, flag)) is not None:
            kwargs[field] = convert(value)
    if "--group-query-attention" in argv:
        kwargs["num_query_groups"] = int(flag_value(argv, "--num-query-groups"))
    if (freq := flag_value(argv, "--moe-layer-freq")) is not None:
        kwargs["moe_layer_freq"] = moe_layer_freq_value(freq)
    if kwargs.get("gated_linear_unit"):
        kwargs["activation_func"] = torch.nn.functional.silu
    return kwargs


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value after the last `flag` (or of `flag=value`) in argv; None when absent."""
    value = None
    for i, tok in enumerate(argv):
        if tok == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value
