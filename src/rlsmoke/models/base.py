"""The model spec: literals only, no I/O, no torch; it renders HF config kwargs, Miles' Megatron args,
and its reductions (`4layer`, `tiny`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from rlsmoke.errors import RlsmokeError


def frozen(d: Mapping | None = None, **kwargs) -> Mapping:
    return MappingProxyType({**(d or {}), **kwargs})


# Every family's tiny width: the same layer structure, seconds to train on 2 CPU cores.
TINY_WIDTH = dict(hidden_size=256, ffn_hidden_size=512, moe_ffn_hidden_size=128, num_experts=16, moe_topk=4,
                  vocab_size=4096)  # fmt: skip
# GLM-5 and GLM-5.3-Flash: MLA and the DSA indexer at the tiny width
TINY_MLA = dict(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, v_head_dim=32, index_head_dim=32,
                index_n_heads=4)  # fmt: skip


def tiny(spec: ModelSpec, *, heads: int, query_groups: int, **extra) -> ModelSpec:
    """`spec` at TINY_WIDTH with `heads` attention heads over `query_groups` KV heads, and `extra` config kwargs."""
    return spec.replace(
        width="tiny",
        num_attention_heads=heads,
        num_query_groups=query_groups,
        **TINY_WIDTH,
        hf_extra=frozen(spec.hf_extra, **extra, max_position_embeddings=4096),
    )


@dataclass(frozen=True)
class ParallelGrid:
    """A family's default NVIDIA colocate layout as caps, each the largest divisor up to its cap."""

    tp: int  # divides the actor GPUs and the heads (GQA: the query groups)
    ep: int  # divides the GPUs of a pipeline stage and the experts
    pp: int = 1  # a long model's stages ...
    pp_from: int = 0  # ... from this many GPUs
    cp: int = 1  # seed 004's launcher: this CP once the GPUs left after TP number at least as many
    # Miles main's launcher: CP `cp` only for a long model from this many GPUs (0: never)
    main_cp_from: int = 0
    whole_from: int = 0  # a long model from this many GPUs takes `whole` as it stands
    whole: Mapping = field(default_factory=frozen)
    engine_gpus: int = 8  # the rollout's GPUs per engine, at most the rollout GPUs
    rollout_dp: bool = True  # dp-attention over every GPU of an engine (else dp 1)
    dense_tp_lm_head: bool = True  # --sglang-moe-dense-tp-size 1 --sglang-enable-dp-lm-head
    rollout_whole_from: int = 0  # from this many rollout GPUs the engines take `rollout_whole`
    rollout_whole: Mapping = field(default_factory=frozen)


@dataclass(frozen=True)
class ModelSpec:
    name: str  # e.g. "glm5-744b-a40b"
    family: str  # "glm5" | "glm5.3-flash" | "glm4.5"
    hf_model_type: str  # AutoConfig.for_model key
    hf_architecture: str
    attention: str  # "mla" | "gqa"
    num_layers: int
    first_k_dense: int  # leading dense layers; the rest are MoE
    hidden_size: int
    ffn_hidden_size: int  # dense MLP
    moe_ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int  # KV heads; equal to the heads for MLA
    num_experts: int
    moe_topk: int
    vocab_size: int
    megatron_args_fn: Callable[[ModelSpec], list[str]] = field(compare=False, repr=False)
    # Everything else transformers needs, as constructor kwargs (MLA ranks, DSA, KDA, ...).
    hf_extra: Mapping = field(default_factory=frozen)
    # Kwargs of the composite top-level config (vision tower of a multimodal model).
    hf_outer: Mapping = field(default_factory=frozen)
    grid: ParallelGrid = field(default_factory=lambda: ParallelGrid(tp=1, ep=1), repr=False)
    width: str = "full"  # "full" | "tiny"
    reduction: str = ""  # "" | "4layer" | "4layer-1gpu"

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense

    @property
    def tp_divisor(self) -> int:
        """What training TP must divide: the heads, or the query groups under GQA."""
        return self.num_query_groups if self.attention == "gqa" else self.num_attention_heads

    def hf_text_kwargs(self) -> dict:
        """Constructor kwargs of the (text) HF config. Derived per-layer lists are left to transformers."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.ffn_hidden_size,
            "moe_intermediate_size": self.moe_ffn_hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_query_groups,
            "n_routed_experts": self.num_experts,
            "num_experts_per_tok": self.moe_topk,
            "first_k_dense_replace": self.first_k_dense,
            "tie_word_embeddings": False,
        } | dict(self.hf_extra)

    def megatron_args(self) -> list[str]:
        return self.megatron_args_fn(self)

    def replace(self, **changes) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    def parameter_count(self) -> int:
        """The exact parameter count of the spec's transformers model (`rlsmoke.models.params`)."""
        from rlsmoke.models.params import parameter_count

        return parameter_count(self).total


def moe_layer_freq(spec: ModelSpec) -> str:
    """Megatron's layer-frequency expression, e.g. `[0]*3+[1]*1`. One shell token."""
    return f"[0]*{spec.first_k_dense}+[1]*{spec.num_moe_layers}"


def reduce_layers(spec: ModelSpec, dense: int = 3, moe: int = 1) -> ModelSpec:
    """Keep `dense` leading dense layers and `moe` MoE layers at full width (upstream's `_4layer`)."""
    if dense > spec.first_k_dense or moe > spec.num_moe_layers:
        raise RlsmokeError(
            f"reduction to {dense} dense + {moe} MoE layers exceeds {spec.name} "
            f"({spec.first_k_dense} dense + {spec.num_moe_layers} MoE)",
            rule="model.reduction",
            fix="ask for at most the layers the model has",
        )
    return spec.replace(num_layers=dense + moe, first_k_dense=dense, reduction=f"{dense + moe}layer")
