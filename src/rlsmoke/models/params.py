"""Exact parameter counts of a spec's transformers model, in the groups memory depends on (tests pin them
against transformers' meta model and a synthesized checkpoint). No torch."""

from __future__ import annotations

from dataclasses import dataclass

# GLM-5.3-Flash: every 4th layer (index 3, 7, ...) is MLA with the DSA indexer; the others are KDA linear attention.
FLASH_MLA_EVERY = 4


def is_kda_layer(spec, index: int) -> bool:
    return spec.hf_model_type == "glm5_next" and index % FLASH_MLA_EVERY != FLASH_MLA_EVERY - 1


def kda_layers(spec) -> int:
    """How many of the spec's layers are KDA linear attention (0 but for GLM-5.3-Flash)."""
    return sum(is_kda_layer(spec, i) for i in range(spec.num_layers))


@dataclass(frozen=True)
class ParamCount:
    """Parameters of a model, exact, in the groups memory depends on."""

    blocks: tuple[int, ...]  # each decoder layer (FSDP2 shards and gathers one at a time)
    root: int  # everything outside the decoder layers: embeddings, final norm, lm_head, vision tower
    experts: int  # routed expert weights, included in `blocks`
    largest_tensor: int  # the biggest single parameter (the sync gathers one at a time)
    embedding: int  # the input embedding (autocast does not cast a lookup)
    buffers: int = 0  # persistent buffers saved in the checkpoint (router expert bias)

    @property
    def total(self) -> int:
        return self.root + sum(self.blocks)


def _mla(h: int, heads: int, x: dict) -> int:
    q_rank, kv_rank = x["q_lora_rank"], x["kv_lora_rank"]
    nope, rope, v = x["qk_nope_head_dim"], x["qk_rope_head_dim"], x["v_head_dim"]
    n = h * q_rank + q_rank + q_rank * heads * (nope + rope)  # q_a, q_a_layernorm, q_b
    # kv_a_proj_with_mqa, kv_a_layernorm, kv_b
    n += h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    n += heads * v * h  # o_proj
    return n


def _indexer(h: int, x: dict, *, kpool: int = 0) -> int:
    """DSA indexer: wq_b, wk, k_norm (LayerNorm: weight and bias), weights_proj; GLM-5.3's key pooling."""
    n_heads, dim = x["index_n_heads"], x["index_head_dim"]
    n = x["q_lora_rank"] * n_heads * dim + h * dim + 2 * dim + h * n_heads
    if kpool:
        n += kpool * dim + dim * h  # index_kpool_compress_ape, index_kpool_compress_gate
    return n


def _kda(h: int, x: dict) -> int:
    """GLM-5.3-Flash's linear attention: q/k/v, depthwise conv, forget gate, beta, output gate and norm, o."""
    heads, dim, kernel = x["linear_num_heads"], x["linear_head_dim"], x.get("linear_conv_kernel_dim", 4)
    qkv = heads * dim
    n = 3 * h * qkv + 3 * qkv * kernel  # q/k/v projections, conv1d (groups = channels, no bias)
    n += h * dim + dim * qkv + qkv + heads  # forget gate: f_a, f_b, dt_bias, A_log
    n += h * heads  # b_proj
    n += h * dim + dim * qkv + dim  # g_a, g_b, o_norm
    n += qkv * h  # o_proj
    return n


# transformers' Glm5NextVisionConfig defaults, used where the spec leaves the vision tower unset.
GLM5_NEXT_VISION = {"depth": 24, "hidden_size": 1024, "num_heads": 16, "in_channels": 3, "patch_size": 14,
                    "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 1536,
                    "intermediate_size": 4096, "projection_intermediate_size": 10240}  # fmt: skip


def _glm5_next_vision(outer: dict) -> int:
    v = {**GLM5_NEXT_VISION, **outer.get("vision_config", {})}
    d, heads, out = v["hidden_size"], v["num_heads"], v["out_hidden_size"]
    head_dim = d // heads
    block = 2 * d  # norm1, norm2
    block += 3 * d * d + 3 * d + d * d + d + 2 * head_dim  # qkv and proj with bias, q_norm, k_norm
    block += 3 * d * v["intermediate_size"] + 2 * v["intermediate_size"] + d  # gate/up/down with bias
    n = v["depth"] * block
    n += v["in_channels"] * d * v["temporal_patch_size"] * v["patch_size"] ** 2 + d  # patch_embed (Conv3d)
    ctx = v["projection_intermediate_size"]
    n += out * out + 2 * out + 3 * out * ctx  # merger: proj, LayerNorm, gate/up/down
    n += d * out * v["spatial_merge_size"] ** 2 + out  # downsample (Conv2d)
    n += d  # post_layernorm
    return n


def parameter_count(spec) -> ParamCount:
    """The exact parameter count of `spec`'s transformers model (text tower and, where present, vision)."""
    h, x = spec.hidden_size, dict(spec.hf_extra)
    norm = 2 * h  # input_layernorm, post_attention_layernorm
    dense_mlp = 3 * h * spec.ffn_hidden_size
    # gate_up_proj (E, 2I, h), down_proj (E, h, I)
    experts = spec.num_experts * 3 * h * spec.moe_ffn_hidden_size
    shared = x.get("n_shared_experts", 1) * 3 * h * spec.moe_ffn_hidden_size
    moe_mlp = experts + shared + spec.num_experts * h  # + the router weight
    embedding = spec.vocab_size * h
    root = 2 * embedding + h  # embed_tokens, lm_head (untied), final norm
    largest = max(embedding, experts * 2 // 3)  # gate_up_proj holds two of the three expert matrices
    if spec.hf_model_type == "glm_moe_dsa":
        attn = [_mla(h, spec.num_attention_heads, x) + _indexer(h, x)] * spec.num_layers
    elif spec.hf_model_type == "glm5_next":
        kpool = x.get("index_kpool", 16)
        attn = [_kda(h, x) if is_kda_layer(spec, i) else _mla(h, spec.num_attention_heads, x) + _indexer(h, x, kpool=kpool)
                for i in range(spec.num_layers)]  # fmt: skip
        hc = x.get("hc_mult", 4)
        width = (2 + hc) * hc
        norm += 2 * (width * hc * h + width + 3)  # attn_hc, ffn_hc: each a fn, base and scale
        root += _glm5_next_vision(dict(spec.hf_outer))
    else:  # glm4_moe
        heads, groups = spec.num_attention_heads, spec.num_query_groups
        d = x.get("head_dim", h // heads)
        bias = x.get("attention_bias", False)
        attn_one = h * d * (heads + 2 * groups) + heads * d * h + (heads + 2 * groups) * d * bias
        attn_one += 2 * d * bool(x.get("use_qk_norm", False))
        attn = [attn_one] * spec.num_layers
    blocks = tuple(a + norm + (dense_mlp if i < spec.first_k_dense else moe_mlp) for i, a in enumerate(attn))
    return ParamCount(blocks=blocks, root=root, experts=experts * spec.num_moe_layers, largest_tensor=largest,
                      embedding=embedding, buffers=spec.num_experts * spec.num_moe_layers)  # fmt: skip
