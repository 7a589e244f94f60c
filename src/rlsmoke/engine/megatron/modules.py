"""The modules the megatron trainer wraps megatron-core's GPTModel in: the HF call, the fp32 main parameters."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlsmoke.bridge.convert import Parallel


class HFStyle(torch.nn.Module):
    """GPTModel behind `model(input_ids=...).logits`: vocab-parallel logits gathered over TP, the sequence
    padded at the end to split evenly under SP (a causal model's earlier positions never see it)."""

    def __init__(self, gpt, vocab_size: int, device: str, par: Parallel | None = None):
        super().__init__()
        self.gpt, self.vocab_size, self.device_name, self.par = gpt, vocab_size, device, par or Parallel()

    def forward(self, input_ids, use_cache=False, **_):
        from rlsmoke.engine.megatron.model import device_shim

        b, s = input_ids.shape
        split = self.par.tp if self.par.tp > 1 and self.par.sp else 1
        pad = -s % split
        if pad:
            input_ids = torch.cat([input_ids, input_ids.new_zeros(b, pad)], dim=1)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(b, -1)
        with device_shim(self.device_name):
            logits = self.gpt(input_ids, pos, None)
            if self.par.tp > 1:
                from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

                logits = gather_from_tensor_model_parallel_region(logits)
        # padded vocab rows are no tokens: Megatron-LM pads, the HF engine samples the real vocab
        return SimpleNamespace(logits=logits[:, :s, : self.vocab_size])


class MainParams(torch.nn.Module):
    """The fp32 main parameters AdamW steps, one per compute parameter (Megatron's main params)."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.params = torch.nn.ParameterList([torch.nn.Parameter(t) for t in tensors])
