"""The routed experts as one grouped GEMM per projection, over `SequentialMLP`'s own parameters.

Miles trains with `--moe-grouped-gemm` (TransformerEngine's grouped linear). Without TransformerEngine
megatron-core offers only `SequentialMLP`: an MLP module per expert, two linear autograd functions each, so
GLM-5 4-layer's 64 experts made a further megatron seed host-bound (3,576 linear calls, 74,703 launches a
seed on an H200). `GroupedExperts` keeps `SequentialMLP`'s modules and parameters (the bridge, DDP, the
offload and the sync see the same tensors) and computes what each expert's `MLP.forward` computes, the
non-fused branch, with `torch._grouped_mm` over the experts' stacked weights. On CPU torch runs a matmul per
expert: the same bits as `SequentialMLP`, forward and backward (tests pin it); on an H100 the grouped
kernel sums in its own order, off in the last bf16 bits (`bench/megatron_experts.py`).
"""

from __future__ import annotations

import torch


def experts_cls():
    from megatron.core.transformer.moe.experts import SequentialMLP

    class GroupedExperts(SequentialMLP):
        def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
            x, config = permuted_local_hidden_states, self.config
            if why_sequential(config, x, self.local_experts[0]):
                return super().forward(x, tokens_per_expert, permuted_probs)
            offsets = torch.cumsum(tokens_per_expert.to(x.device), 0, dtype=torch.int32)
            fc1 = torch.stack([e.linear_fc1.weight for e in self.local_experts])  # [E, out, in]
            fc2 = torch.stack([e.linear_fc2.weight for e in self.local_experts])
            h = torch._grouped_mm(x, fc1.transpose(1, 2), offs=offsets)
            if config.gated_linear_unit:  # MLP.forward's glu, no clamp, no offset (why_sequential)
                gate, linear = torch.chunk(h, 2, dim=-1)
                h = config.activation_func(gate) * linear
            else:
                h = config.activation_func(h)
            h = (h * permuted_probs.unsqueeze(-1)).to(h.dtype)  # per_token_scale, as MLP applies it
            return torch._grouped_mm(h, fc2.transpose(1, 2), offs=offsets), None

    return GroupedExperts


def why_sequential(config, x: torch.Tensor, expert) -> str | None:
    """Why these experts run `SequentialMLP`'s loop rather than the grouped GEMM; None when they need not."""
    if not hasattr(torch, "_grouped_mm"):
        return "this torch has no _grouped_mm"
    if x.shape[0] == 0:
        return "no token reached this rank's experts"
    if config.moe_apply_probs_on_input or config.fp8 or config.fp4:
        return "the probs on the input, or a quantized recipe"
    if config.add_bias_linear or config.bias_activation_fusion or config.use_te_activation_func:
        return "a bias or a fused activation"
    if config.gated_linear_unit and (
        config.activation_func_clamp_value is not None or config.glu_linear_offset
    ):
        return "a clamped or offset GLU"
    fc1 = expert.linear_fc1.weight
    if config.moe_latent_size is not None or fc1.shape[1] != x.shape[-1]:
        return "a latent projection"
    if any(n * x.element_size() % 16 for n in (*fc1.shape, expert.linear_fc2.weight.shape[1])):
        return "a width the grouped kernel cannot align to 16 bytes"
    return None
