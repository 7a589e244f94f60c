"""The megatron train worker: megatron-core's GPTModel loaded through the bridge, trained by the same
GRPO step as the HF trainer, synced back into the HF rollout engine through the bridge.

One process, world size 1 (TP = EP = 1): what runs colocated here. The bridge's TP/EP shards and the
model at TP=2 / EP=2 are checked under gloo (tests/unit/test_megatron_bridge.py); a multi-rank
megatron training step is not wired into the engine.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from rlsmoke.bridge.convert import Parallel, hf_to_megatron, megatron_to_hf, unshard
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.model import TORCH_DTYPES
from rlsmoke.engine.train import Trainer
from rlsmoke.errors import RlsmokeError
from rlsmoke.models import model_spec


class HFStyle(torch.nn.Module):
    """GPTModel behind the HF call the trainer makes: `model(input_ids=...).logits` over the real vocab."""

    def __init__(self, gpt, vocab_size: int, device: str):
        super().__init__()
        self.gpt, self.vocab_size, self.device_name = gpt, vocab_size, device

    def forward(self, input_ids, use_cache=False, **_):
        from rlsmoke.engine.megatron.model import device_shim

        pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(input_ids.shape[0], -1)
        with device_shim(self.device_name):
            logits = self.gpt(input_ids, pos, None)
        # padded vocab rows are no tokens: Megatron-LM pads, the HF engine samples the real vocab
        return SimpleNamespace(logits=logits[..., : self.vocab_size])


class MegatronTrainWorker:
    def __init__(self, cfg: RunConfig, ckpt: Path, threads: int | None = None):
        from rlsmoke.engine import megatron
        from rlsmoke.engine.megatron import dist
        from rlsmoke.engine.megatron.model import build_gpt, read_hf_state

        if not megatron.available():
            raise RlsmokeError("trainer=megatron needs megatron-core, which is not installed",
                               rule="engine.megatron", fix="pip install 'rlsmoke[megatron]'")  # fmt: skip
        if threads:
            torch.set_num_threads(threads)
        self.cfg, self.spec = cfg, model_spec(cfg.case, tiny=cfg.tiny)
        self.par = Parallel()
        self.defect = cfg.inject.kind if cfg.inject.kind.startswith("bridge-") else None
        import torch.distributed as tdist

        if not tdist.is_initialized():
            dist.init(0, self.par, dist.free_port(), backend="gloo")
        self.hf = read_hf_state(ckpt)
        dtype = TORCH_DTYPES[cfg.train_dtype]
        gpt = build_gpt(self.spec, self.par, params_dtype=dtype, device=cfg.device)
        full = hf_to_megatron({k: v.to(dtype) for k, v in self.hf.items()}, self.spec,
                              vocab_size=gpt.vocab_size, defect=self.defect)  # fmt: skip
        # world size 1: the whole state is rank 0's shard; the router's expert bias stays fp32
        gpt.load_state_dict({k: v for k, v in full.items() if not k.startswith("model.")}, strict=True)
        self.trainer = Trainer(
            HFStyle(gpt, self.spec.vocab_size, cfg.device), lr=cfg.lr, betas=cfg.betas,
            weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, eps_clip=cfg.eps_clip,
            eps_clip_high=cfg.eps_clip_high, entropy_coef=cfg.entropy_coef,
            compute_dtype=TORCH_DTYPES[cfg.train_compute_dtype], temperature=cfg.rollout_temperature,
        )  # fmt: skip

    def forward_only(self, groups):
        return self.trainer.forward_only(groups)

    def step(self, groups, old, advantages) -> dict[str, float]:
        return self.trainer.step(groups, old, advantages)

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """The trainer's weights under HF checkpoint names: Megatron -> HF through the bridge."""
        from rlsmoke.engine.megatron.model import rank_state

        state = {k: v.detach() for k, v in rank_state(self.trainer.model.gpt).items()}
        passengers = {k: v for k, v in self.hf.items() if k.startswith("model.visual.")}
        full = unshard([state | passengers], self.spec, self.hf, self.par)
        return megatron_to_hf(full, self.spec, self.hf, defect=self.defect)

    def rollout_weights(self, model, dtype: torch.dtype):
        """What the rollout engine should hold, under its in-memory names (fused experts stacked)."""
        return in_memory_weights(model, self.hf_weights(), dtype)


def in_memory_weights(model, disk: dict[str, torch.Tensor], dtype: torch.dtype):
    """HF checkpoint tensors -> the HF model's in-memory parameters. transformers fuses a MoE layer's
    experts into `experts.gate_up_proj` (E, 2I, H: gate rows then up rows) and `experts.down_proj`."""
    for name, p in model.named_parameters():
        if name in disk:
            t = disk[name]
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            base, kind = name.rsplit(".", 1)
            n = p.shape[0]
            if kind == "gate_up_proj":
                t = torch.stack([torch.cat([disk[f"{base}.{e}.gate_proj.weight"], disk[f"{base}.{e}.up_proj.weight"]])
                                 for e in range(n)])  # fmt: skip
            else:
                t = torch.stack([disk[f"{base}.{e}.down_proj.weight"] for e in range(n)])
        else:
            raise RlsmokeError(f"rollout parameter {name} has no HF checkpoint tensor", rule="bridge.hf_names")
        if t.shape != p.shape:
            raise RlsmokeError(f"rollout parameter {name} is {tuple(p.shape)}, the bridge gives {tuple(t.shape)}",
                               rule="bridge.hf_shapes")  # fmt: skip
        yield name, t.to(dtype)
