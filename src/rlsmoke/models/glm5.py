"""GLM-5 744B-A40B (HF `glm_moe_dsa`): MLA attention with the DSA indexer, 3 dense + 75 MoE layers."""

from __future__ import annotations

from functools import partial

from rlsmoke.models.base import TINY_MLA, ModelSpec, ParallelGrid, frozen, moe_layer_freq, tiny


def dsa_megatron_args(spec: ModelSpec, *, plugin: tuple[str, str], rope: bool) -> list[str]:
    """The Megatron args GLM-5 and GLM-5.3-Flash share (sigmoid router with expert bias, MLA): `plugin` is
    Miles' layer spec; without `rope` (Flash: qk_rope_head_dim 0) there is no rotary part."""
    x = spec.hf_extra
    return [
        "--spec", *plugin,
        "--moe-layer-freq", moe_layer_freq(spec),
        "--num-experts", str(spec.num_experts),
        "--moe-router-topk", str(spec.moe_topk),
        "--moe-ffn-hidden-size", str(spec.moe_ffn_hidden_size),
        "--moe-shared-expert-intermediate-size", str(spec.moe_ffn_hidden_size),
        "--moe-grouped-gemm", "--moe-permute-fusion",
        "--moe-router-score-function", "sigmoid", "--moe-router-pre-softmax",
        "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0",
        "--moe-router-load-balancing-type", "seq_aux_loss",
        "--moe-router-topk-scaling-factor", str(x["routed_scaling_factor"]),
        "--moe-aux-loss-coeff", "0", "--moe-router-dtype", "fp32",
        "--make-vocab-size-divisible-by", "16",
        "--num-layers", str(spec.num_layers),
        "--hidden-size", str(spec.hidden_size),
        "--ffn-hidden-size", str(spec.ffn_hidden_size),
        "--num-attention-heads", str(spec.num_attention_heads),
        "--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights",
        "--position-embedding-type", *(("rope", "--no-position-embedding") if rope else ("none",)),
        "--normalization", "RMSNorm", "--qk-layernorm",
        "--multi-latent-attention",
        "--q-lora-rank", str(x["q_lora_rank"]),
        "--kv-lora-rank", str(x["kv_lora_rank"]),
        "--qk-head-dim", str(x["qk_nope_head_dim"]),
        "--v-head-dim", str(x["v_head_dim"]),
        "--kv-channels", str(x["qk_nope_head_dim"]),
        "--qk-pos-emb-head-dim", str(x["qk_rope_head_dim"]),
        "--vocab-size", str(spec.vocab_size),
        *(("--rotary-base", "1000000") if rope else ()),
        "--enable-experimental",
    ]  # fmt: skip


glm5_megatron_args = partial(
    dsa_megatron_args, plugin=("miles_plugins.models.glm5.glm5", "get_glm5_spec"), rope=True
)

# Seed 004 NVIDIA: 8 GPUs as TP4+SP, CP2, EP8, one rollout engine of 8; PP4 from 32 GPUs. Miles main
# trains CP1 (600ac7452).
GLM5_GRID = ParallelGrid(tp=4, ep=8, pp=4, pp_from=32, cp=2, main_cp_from=128)


def glm5_744b_a40b() -> ModelSpec:
    return ModelSpec(
        name="glm5-744b-a40b",
        family="glm5",
        hf_model_type="glm_moe_dsa",
        hf_architecture="GlmMoeDsaForCausalLM",
        attention="mla",
        num_layers=78,
        first_k_dense=3,
        hidden_size=6144,
        ffn_hidden_size=12288,
        moe_ffn_hidden_size=2048,
        num_attention_heads=64,
        num_query_groups=64,
        num_experts=256,
        moe_topk=8,
        vocab_size=154880,
        hf_extra=frozen(
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            q_lora_rank=2048,
            kv_lora_rank=512,
            qk_nope_head_dim=192,
            qk_rope_head_dim=64,
            v_head_dim=256,
            index_topk=2048,
            index_head_dim=128,
            index_n_heads=32,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"},
        ),
        megatron_args_fn=glm5_megatron_args,
        grid=GLM5_GRID,
    )


def glm5_tiny(spec: ModelSpec) -> ModelSpec:
    """Trains on 2 CPU cores in seconds. index_topk stays 2048: past it DSA's decode and full forward break
    ties at an index score of 0 differently; below it both attend to every key, as seed 004's shape does."""
    return tiny(spec, heads=4, query_groups=4, **TINY_MLA, qk_rope_head_dim=16)
