"""GLM-5.3-Flash (HF `glm5_next`): hybrid KDA linear attention + MLA/DSA, 3 dense + 42 MoE layers; the HF
config is multimodal and rlsmoke trains the text tower."""

from __future__ import annotations

from functools import partial

from rlsmoke.models.base import TINY_MLA, ModelSpec, ParallelGrid, frozen, tiny
from rlsmoke.models.glm5 import dsa_megatron_args

glm5_flash_megatron_args = partial(
    dsa_megatron_args, plugin=("miles_plugins.models.glm5_next.glm5_next", "get_glm5_next_spec"), rope=False
)

# Seed 000: 32 GPUs as TP8 / PP4 / EP8 / CP1 (stages 11/11/11/12); 8-GPU rollout engines, TP8 / EP8.
FLASH_GRID = ParallelGrid(tp=8, ep=8, pp=4, pp_from=32, rollout_dp=False, dense_tp_lm_head=False)


def glm5_3_flash() -> ModelSpec:
    return ModelSpec(
        name="glm5.3-flash",
        family="glm5.3-flash",
        hf_model_type="glm5_next",
        hf_architecture="Glm5NextForConditionalGeneration",
        attention="mla",
        num_layers=45,
        first_k_dense=3,
        hidden_size=4096,
        ffn_hidden_size=12288,
        moe_ffn_hidden_size=2048,
        num_attention_heads=64,
        num_query_groups=64,
        num_experts=288,
        moe_topk=8,
        vocab_size=154880,
        hf_extra=frozen(
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=256,
            qk_rope_head_dim=0,
            v_head_dim=256,
            index_topk=2048,
            index_head_dim=128,
            index_n_heads=32,
            linear_num_heads=64,
            linear_head_dim=128,
            linear_conv_kernel_dim=4,
            swiglu_limit=10.0,
            hc_mult=4,
        ),
        megatron_args_fn=glm5_flash_megatron_args,
        grid=FLASH_GRID,
    )


def glm5_flash_tiny(spec: ModelSpec) -> ModelSpec:
    small = tiny(spec, heads=4, query_groups=4, **TINY_MLA, linear_num_heads=4, linear_head_dim=32, hc_mult=2)
    # A vision tower is mandatory in the composite config; make it negligible.
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 256,
              "projection_intermediate_size": 64}  # fmt: skip
    # pad_token_id: the full model's pad id lies outside the tiny vocab
    return small.replace(
        hf_extra=frozen(small.hf_extra, pad_token_id=None), hf_outer=frozen(vision_config=vision)
    )
