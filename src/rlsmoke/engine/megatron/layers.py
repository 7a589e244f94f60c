"""Layers megatron-core has none of without TransformerEngine: causal core attention (with DSA's indexer),
a Linear whole on every TP rank, and a torch norm for sequence parallelism."""

from __future__ import annotations

import dataclasses
import math

import torch

from rlsmoke.errors import RlsmokeError


def core_attention_cls():
    from megatron.core.transformer.module import MegatronModule

    class CausalCoreAttention(MegatronModule):
        """Causal SDPA over [s, b, h, d] (keys may have fewer heads: GQA) -> [s, b, h * dv]."""

        def __init__(self, config, softmax_scale=None, k_channels=None, pg_collection=None, **_):
            super().__init__(config=config)
            head_dim = k_channels if k_channels is not None else config.kv_channels
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
            self.index_topk = None
            if getattr(config, "dsa_indexer_topk", None):
                from megatron.core.transformer.experimental_attention_variant import dsa
                from megatron.core.transformer.spec_utils import ModuleSpec, build_module
                from megatron.core.transformer.torch_norm import WrappedTorchNorm

                linear = DuplicatedLinear
                norm = SequenceParallelNorm if config.sequence_parallel else WrappedTorchNorm
                parts = dsa.DSAIndexerSubmodules(linear_wq_b=linear, linear_wk=linear, k_norm=norm,
                                                 linear_weights_proj=linear)  # fmt: skip
                spec = ModuleSpec(module=dsa.DSAIndexer, submodules=parts)
                self.indexer = build_module(spec, config=config, pg_collection=pg_collection)
                self.index_topk = config.dsa_indexer_topk

        def forward(self, query, key, value, *_, **__):
            s = query.shape[0]
            if self.index_topk is not None and s > self.index_topk:
                raise RlsmokeError(
                    f"sequence length {s} exceeds the DSA index top-k {self.index_topk}; dense causal "
                    "attention equals DSA only within it",
                    rule="megatron.dsa_topk",
                    fix="lower --max-response-len or shorten the prompts",
                )
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
            if k.shape[1] != q.shape[1]:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   scale=self.softmax_scale)  # fmt: skip
            return out.permute(2, 0, 1, 3).flatten(2)

    return CausalCoreAttention


class DuplicatedLinear(torch.nn.Linear):
    """A Linear held whole on every TP rank, returning (out, bias) as megatron-core's linears do."""

    def __init__(self, input_size, output_size, *, config, bias=False, **_):
        super().__init__(input_size, output_size, bias=bias, dtype=config.params_dtype)
        # a sequence chunk's partial grad: finalize_model_grads sums it over TP
        for p in self.parameters():
            p.sequence_parallel = config.sequence_parallel

    def forward(self, x):
        return super().forward(x), None


class SequenceParallelNorm:
    """`WrappedTorchNorm` refuses sequence parallelism; marked `sequence_parallel` as TE's norms are."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_):
        norm_cls = torch.nn.LayerNorm if config.normalization == "LayerNorm" else torch.nn.RMSNorm
        norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def sequence_parallel_norms(spec) -> None:
    """Swap every `WrappedTorchNorm` in a (nested) layer spec for `SequenceParallelNorm`."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if isinstance(spec, list):
        for item in spec:
            sequence_parallel_norms(item)
    elif dataclasses.is_dataclass(spec) and not isinstance(spec, type):  # a ModuleSpec or its submodules
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            if value is WrappedTorchNorm:
                setattr(spec, f.name, SequenceParallelNorm)
            else:
                sequence_parallel_norms(value)
