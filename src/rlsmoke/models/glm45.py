"""GLM-4.5 355B-A32B and GLM-4.5-Air (HF `glm4_moe`): GQA attention with QK norm and qkv bias."""

from __future__ import annotations

from rlsmoke.models.base import ModelSpec, ParallelGrid, frozen, moe_layer_freq, tiny


def glm45_megatron_args(spec: ModelSpec) -> list[str]:
    x = spec.hf_extra
    return [
        "--disable-bias-linear", *(["--qk-layernorm"] if x["use_qk_norm"] else []), "--group-query-attention",
        "--num-attention-heads", str(spec.num_attention_heads),
        "--num-query-groups", str(spec.num_query_groups),
        "--kv-channels", str(x["head_dim"]),
        "--num-layers", str(spec.num_layers),
        "--hidden-size", str(spec.hidden_size),
        "--ffn-hidden-size", str(spec.ffn_hidden_size),
        "--add-qkv-bias", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--rotary-percent", "0.5",
        "--swiglu", "--untie-embeddings-and-output-weights",
        "--vocab-size", str(spec.vocab_size),
        "--rotary-base", "1000000",
        "--moe-ffn-hidden-size", str(spec.moe_ffn_hidden_size),
        "--moe-shared-expert-intermediate-size", str(spec.moe_ffn_hidden_size),
        "--moe-router-pre-softmax", "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0",
        "--moe-router-load-balancing-type", "seq_aux_loss",
        "--moe-token-dispatcher-type", "alltoall",
        "--moe-router-topk", str(spec.moe_topk),
        "--moe-router-topk-scaling-factor", str(x["routed_scaling_factor"]),
        "--moe-layer-freq", moe_layer_freq(spec),
        "--num-experts", str(spec.num_experts),
        "--moe-grouped-gemm", "--moe-router-dtype", "fp32", "--moe-permute-fusion",
        "--moe-aux-loss-coeff", "0",
    ]  # fmt: skip


# Seed 003: up to 32 GPUs TP4 PP1 CP1 EP4, 64 GPUs TP8 PP4 CP2 EP16; rollout engines of 32 from 32 GPUs.
GLM45_GRID = ParallelGrid(tp=4, ep=4, whole_from=64, whole=frozen(tp=8, pp=4, cp=2, ep=16),
                          rollout_whole_from=32, rollout_whole=frozen(gpus_per_engine=32, dp=4, ep=32))  # fmt: skip


def _glm45(name: str, extra: dict | None = None, **shape) -> ModelSpec:
    defaults = dict(
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        head_dim=128,
        attention_bias=True,
        use_qk_norm=True,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_theta": 1000000.0, "partial_rotary_factor": 0.5, "rope_type": "default"},
    )
    return ModelSpec(
        name=name,
        family="glm4.5",
        hf_model_type="glm4_moe",
        hf_architecture="Glm4MoeForCausalLM",
        attention="gqa",
        hf_extra=frozen(defaults, **(extra or {})),
        megatron_args_fn=glm45_megatron_args,
        grid=GLM45_GRID,
        **shape,
    )


def glm45_355b_a32b() -> ModelSpec:
    return _glm45(
        "glm4.5-355b-a32b",
        num_layers=92, first_k_dense=3, hidden_size=5120, ffn_hidden_size=12288,
        moe_ffn_hidden_size=1536, num_attention_heads=96, num_query_groups=8,
        num_experts=160, moe_topk=8, vocab_size=151552,
    )  # fmt: skip


def glm45_air() -> ModelSpec:
    """GLM-4.5-Air 106B-A12B: transformers' own `glm4_moe` defaults."""
    return _glm45(
        "glm4.5-air",
        num_layers=46, first_k_dense=1, hidden_size=4096, ffn_hidden_size=10944,
        moe_ffn_hidden_size=1408, num_attention_heads=96, num_query_groups=8,
        num_experts=128, moe_topk=8, vocab_size=151552,
        extra={"routed_scaling_factor": 1.0, "use_qk_norm": False},
    )  # fmt: skip


def glm45_tiny(spec: ModelSpec) -> ModelSpec:
    return tiny(spec, heads=8, query_groups=2, head_dim=32)
