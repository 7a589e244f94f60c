"""A megatron-core `GPTModel` from the Megatron flags the plan renders for Miles (one source).

The config is `config_kwargs` of the rendered argv (Megatron-LM's `core_transformer_config_from_args`).
Layers are megatron-core's local specs with the layers it has none of without TransformerEngine (below):
our causal core attention (with DSA's indexer), a Linear whole on every TP rank, a torch norm for sequence
parallelism. The local `DotProductAttention` rejects MLA's head dims, `DSAttention` needs a CUDA kernel.
GLM-5's layer attends over every causal key, DSA exactly while the sequence is within index_topk (longer is
refused).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from rlsmoke.bridge.convert import Parallel, padded_vocab
from rlsmoke.engine.megatron import refusal
from rlsmoke.engine.megatron.experts import experts_cls
from rlsmoke.engine.megatron.flags import config_kwargs, flag_value
from rlsmoke.errors import RlsmokeError
from rlsmoke.models import ModelSpec


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
            if (value := getattr(spec, f.name)) is WrappedTorchNorm:
                setattr(spec, f.name, SequenceParallelNorm)
            else:
                sequence_parallel_norms(value)


def transformer_config(spec: ModelSpec, par: Parallel, *, params_dtype: torch.dtype, device: str):
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    argv = spec.megatron_args()  # the Megatron model flags the plan renders for Miles
    mla = "--multi-latent-attention" in argv
    kw = config_kwargs(argv, mla=mla)
    kw.update(
        # megatron-core's grouped GEMMs need TransformerEngine or grouped_gemm: SequentialMLP's modules, run
        # grouped by `experts.GroupedExperts`; the fused kernels, the MoE permute's too, stay off as
        # megatron-core's defaults have them
        moe_grouped_gemm=False,
        tensor_model_parallel_size=par.tp,
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.expert_tp,
        sequence_parallel=par.tp > 1 and par.sp,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        # built where it runs (a host build and copy of GLM-5 4-layer took 3.3-5.4 s on an H200)
        use_cpu_initialization=not device.startswith("cuda"),
        perform_initialization=False,  # every weight comes from the checkpoint
        hidden_dropout=0.0,
        attention_dropout=0.0,
        layernorm_epsilon=float(spec.hf_extra.get("rms_norm_eps", 1e-5)),
        # the loss is already divided by the global token count: DDP sums instead of averaging
        calculate_per_token_loss=True,
    )
    if (rate := flag_value(argv, "--moe-router-bias-update-rate")) is not None:
        # config_kwargs drops a rate of 0, whose default 1e-3 would move the expert bias; Miles freezes it
        kw["moe_router_bias_update_rate"] = float(rate)
    if not device.startswith("cuda"):
        kw["moe_token_dispatcher_type"] = "allgather"
    if mla:
        kw["rope_type"] = "rope"  # MLATransformerConfig defaults to yarn; GLM-5 uses plain RoPE
        x = spec.hf_extra
        if "index_topk" in x:
            kw.update(dsa_indexer_n_heads=x["index_n_heads"], dsa_indexer_head_dim=x["index_head_dim"],
                      dsa_indexer_topk=x["index_topk"])  # fmt: skip
    return (MLATransformerConfig if mla else TransformerConfig)(**kw)


def layer_spec(config):
    """The local block spec with our core attention, the routed experts grouped (`GroupedExperts`) and MLA's
    down projections duplicated as TE's spec does: split by rows, the shared RoPE key's grad was 50-110% off
    at TP=2 (tiny GLM-5)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.post_training.modelopt.layers import Linear
    from megatron.core.transformer.moe.experts import SequentialMLP

    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    core, grouped = core_attention_cls(), experts_cls()
    for layer in block.layer_specs:
        experts = getattr(getattr(layer.submodules.mlp, "submodules", None), "experts", None)
        if experts is not None and experts.module is SequentialMLP:
            experts.module = grouped
        attention = layer.submodules.self_attention.submodules
        attention.core_attention = core
        if hasattr(attention, "linear_kv_down_proj"):
            attention.linear_kv_down_proj = Linear
            if getattr(attention, "linear_q_down_proj", None) is not None:
                attention.linear_q_down_proj = Linear
    if config.sequence_parallel:
        sequence_parallel_norms(block)
    return block


@contextlib.contextmanager
def device_shim(device: str):
    """`torch.cuda.current_device()` answers the CPU while megatron-core code runs on a CPU-only torch."""
    if device.startswith("cuda"):
        yield
        return
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    # Under TP and SP the embedding forks the CUDA RNG stream; with dropout 0 nothing is drawn in it.
    tracker = get_cuda_rng_tracker()
    original, fork = torch.cuda.current_device, tracker.fork
    torch.cuda.current_device = lambda: torch.device("cpu")
    tracker.fork = lambda *_, **__: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.current_device, tracker.fork = original, fork


def _without_transformer_engine() -> None:
    """megatron-core 0.16.1 without TE: `te_general_gemm` and `TELinear` get the None their fallback means."""
    from megatron.core.transformer import multi_latent_attention as mla
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if getattr(mla, "HAVE_TE", False) and not isinstance(getattr(mla, "TELinear", None), type):
        mla.HAVE_TE = False


def build_gpt(spec: ModelSpec, par: Parallel, *, params_dtype: torch.dtype = torch.float32,
              device: str = "cpu"):  # fmt: skip
    """The rank's GPTModel (model-parallel state must be initialized for `par`)."""
    if why := refusal(spec):  # RunConfig.validate refuses it first, before anything loads
        raise RlsmokeError(
            why, rule="megatron.model", fix="use --trainer fsdp for GLM-5.3-Flash; its bridge is still tested"
        )
    from megatron.core.models.gpt import GPTModel

    _without_transformer_engine()
    argv = spec.megatron_args()
    config = transformer_config(spec, par, params_dtype=params_dtype, device=device)
    divisible_by = int(flag_value(argv, "--make-vocab-size-divisible-by") or 128)
    with device_shim(device):
        model = GPTModel(
            config,
            layer_spec(config),
            vocab_size=padded_vocab(spec.vocab_size, divisible_by, par.tp),
            max_sequence_length=int(spec.hf_extra.get("max_position_embeddings", 4096)),
            position_embedding_type=flag_value(argv, "--position-embedding-type") or "learned_absolute",
            rotary_percent=float(flag_value(argv, "--rotary-percent") or 1.0),
            rotary_base=int(float(flag_value(argv, "--rotary-base") or 10000)),
            share_embeddings_and_output_weights="--untie-embeddings-and-output-weights" not in argv,
        )
    # HF builds MLA's q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, the DSA indexer's key norm
    # as LayerNorm(eps=1e-6); megatron-core builds them with rms_norm_eps (1e-5), which put the logits 2.6e-3
    # off HF's (tiny GLM-5, fp32)
    latent_norms = ("self_attention.q_layernorm", "self_attention.kv_layernorm", "indexer.k_norm")
    for name, module in model.named_modules() if "--multi-latent-attention" in argv else ():
        if name.endswith(latent_norms) and hasattr(module, "eps"):
            module.eps = 1e-6
    _mark_tensor_parallel(model)
    return model.to(device)


def _mark_tensor_parallel(model) -> None:
    """megatron-core marks TP-split weights only in its initializer: unmarked, TP=2's grad norm was wrong."""
    from megatron.core import tensor_parallel

    for name, module in model.named_modules():
        if (weight := getattr(module, "weight", None)) is None or hasattr(weight, "tensor_model_parallel"):
            continue
        if isinstance(module, (tensor_parallel.ColumnParallelLinear, tensor_parallel.VocabParallelEmbedding)):
            # a gated fc1 holds [gate_r; up_r] on each rank: megatron-core's stride 2
            gated = name.endswith("linear_fc1") and module.config.gated_linear_unit
            tensor_parallel.set_tensor_model_parallel_attributes(weight, True, 0, 2 if gated else 1)
        elif isinstance(module, tensor_parallel.RowParallelLinear):
            tensor_parallel.set_tensor_model_parallel_attributes(weight, True, 1, 1)
    for p in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)


def rank_state(model) -> dict[str, torch.Tensor]:
    """The rank's Megatron tensors (parameters and the router's expert bias), not the extra states."""
    return {
        k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor) and "_extra_state" not in k
    }
