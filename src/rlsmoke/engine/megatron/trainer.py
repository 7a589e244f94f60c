"""The megatron trainer: megatron-core's GPTModel, built as Megatron builds it, loaded and synced through
the bridge, trained by the HF trainer's GRPO loss.

Megatron's bf16 training (Miles: `args.bf16`, `--moe-router-dtype fp32`), no `torch.autocast` (there the
router's bf16 logits fail `topk_routing_with_score_function`). megatron-core 0.16.1's optimizers need CUDA,
so the step is torch AdamW over fp32 main parameters (`rlsmoke.engine.precision`), on CPU and GPU alike.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from rlsmoke.bridge.convert import Parallel, hf_to_megatron, megatron_to_hf, shard, unshard
from rlsmoke.engine import precision, train
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.megatron import MODULES, available
from rlsmoke.engine.megatron.dist import backend_for, init
from rlsmoke.engine.megatron.model import build_gpt, device_shim, rank_state
from rlsmoke.engine.model import TORCH_DTYPES
from rlsmoke.engine.read import read_checkpoint, unfilled
from rlsmoke.engine.timing import Laps
from rlsmoke.errors import RlsmokeError, RunError
from rlsmoke.models import ModelSpec


class HFStyle(torch.nn.Module):
    """GPTModel behind `model(input_ids=...).logits`: vocab-parallel logits gathered over TP, the sequence
    padded at the end to split evenly under SP (a causal model's earlier positions never see it)."""

    def __init__(self, gpt, vocab_size: int, device: str, par: Parallel):
        super().__init__()
        self.gpt, self.vocab_size, self.device_name, self.par = gpt, vocab_size, device, par

    def forward(self, input_ids, use_cache=False, **_):
        b, s = input_ids.shape
        if pad := -s % (self.par.tp if self.par.sp else 1):
            input_ids = torch.cat([input_ids, input_ids.new_zeros(b, pad)], dim=1)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(b, -1)
        with device_shim(self.device_name):
            logits = self.gpt(input_ids, pos, None)
            if self.par.tp > 1:
                from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

                logits = gather_from_tensor_model_parallel_region(logits)
        # padded vocab rows are no tokens: Megatron-LM pads, the HF engine samples the real vocab
        return SimpleNamespace(logits=logits[:, :s, : self.vocab_size])


class MegatronTrainer:
    """One rank's trainer, with the attributes `engine.offload.Phases` moves."""

    def __init__(self, compute: HFStyle, gpt, ddp, pairs, par: Parallel, cfg: RunConfig, device: str):
        self.model, self.gpt, self.ddp, self.par, self.cfg = compute, gpt, ddp, par, cfg
        # the fp32 main parameters AdamW steps, one per compute parameter (Megatron's main params)
        self.master = torch.nn.ParameterList([m for _, m in pairs])
        self._pairs = list(zip([p for p, _ in pairs], self.master, strict=True))  # (compute, main)
        self.temperature, self.comm_device = cfg.rollout_temperature, device
        # the compute parameters the backward reached: in main_grad an unreached one looks like a zero grad
        self._reached: set[int] = set()
        for i, (p, _) in enumerate(self._pairs):
            p.register_hook(lambda grad, i=i: self._reached.add(i))
        fused = device.startswith("cuda") or None
        self.optimizer = torch.optim.AdamW(self.master.parameters(), lr=cfg.lr, betas=cfg.betas,
                                           weight_decay=cfg.weight_decay, fused=fused)  # fmt: skip

    def set_variant(self, inject, temperature: float) -> None:
        """`--variants`: the temperature; other faults are refused before the load (`RunConfig.validate`)."""
        self.temperature = temperature

    @torch.no_grad()
    def forward_only(self, groups):
        """The old log-probs and entropies, eval mode, no graph (no autocast: the params are the dtype)."""
        self.model.eval()
        out = [train.token_logprobs(self.model, g, self.temperature) for g in groups]
        return [(logp.cpu(), entropy.cpu()) for logp, entropy in out]  # one wait, after the last forward

    def _sum(self, values: list[float], group=None) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(t, group=group)
        return t.tolist()

    def step(self, groups, old, advantages) -> dict[str, float]:
        """One optimizer step over this data-parallel rank's groups; metrics over the whole batch."""
        from megatron.core import parallel_state
        from megatron.core.distributed import finalize_model_grads

        dp_group, cfg = parallel_state.get_data_parallel_group(), self.cfg
        self.model.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=True)
        self._reached.clear()
        device = torch.device(self.comm_device)
        total_tokens = max(self._sum([float(sum(g.mask.sum() for g in groups))], dp_group)[0], 1.0)
        step_sums = train.StepSums()
        for g, old_lp, adv in zip(groups, old, advantages, strict=True):
            mask = g.mask.to(device)
            logp, entropy = train.token_logprobs(self.model, g, self.temperature)
            loss, group_sums = train.group_loss(logp, entropy, mask, old_lp.to(device), adv.to(device),
                                                eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high,
                                                entropy_coef=cfg.entropy_coef)  # fmt: skip
            step_sums.add(g, loss, group_sums)
            with device_shim(self.comm_device):  # SP's backward asks megatron-core's device too
                (loss / total_tokens).backward()
        sums = step_sums.totals()
        with device_shim(self.comm_device):
            finalize_model_grads([self.ddp])  # DP reduction, SP norms across TP
        for i, (p, main) in enumerate(self._pairs):
            # a parameter outside the graph (the DSA indexer) keeps no grad, so AdamW skips it
            main.grad = p.main_grad.to(main.dtype) if i in self._reached else None
        grad_norm = self._grad_norm()
        if not torch.isfinite(torch.tensor(grad_norm)):
            raise RunError(f"grad_norm is {grad_norm}", rule="train.finite_grads")
        coef = cfg.grad_clip / (grad_norm + 1e-6)
        if coef < 1.0:  # torch's clip_grad_norm_ rule, over the global norm
            for main in self.master.parameters():
                if main.grad is not None:
                    main.grad.mul_(coef)
        before = train.checksums(self.master)
        self.optimizer.step()
        precision.refresh(self._pairs)
        after = train.checksums(self.master)
        changed, count = self._sum([float(sum(after[n] != before[n] for n in before)), float(len(before))])
        if changed == 0:
            raise RunError("the optimizer step changed no parameter", rule="train.update_applied")
        self.model.eval()
        totals = dict(zip(sums, self._sum(list(sums.values()), dp_group), strict=True))
        return train.step_metrics(totals, total_tokens, grad_norm=grad_norm, changed=changed, count=count,
                                  lr=self.optimizer.param_groups[0]["lr"])  # fmt: skip

    @torch.no_grad()
    def _grad_norm(self) -> float:
        """The global grad norm: each tensor's squares divided by the ranks holding the same tensor."""
        world, par = self.par.world_size, self.par
        local = torch.zeros((), dtype=torch.float64, device=self.comm_device)
        for p, main in self._pairs:
            if main.grad is None:
                continue
            expert = not getattr(p, "allreduce", True)  # megatron-core marks expert parameters so
            split = (par.expert_tp if expert else par.tp) if getattr(p, "tensor_model_parallel", False) else 1
            local += main.grad.double().pow(2).sum() / (world // ((par.ep if expert else 1) * split))
        [total] = self._sum([local.item()])
        return total**0.5


def build_rank(spec: ModelSpec, hf: dict[str, torch.Tensor], par: Parallel, rank: int, *, cfg: RunConfig,
               device: str, defect: str | None = None, phases: dict[str, float] | None = None) -> MegatronTrainer:  # fmt: skip
    """This rank's GPTModel under DDP, its fp32 main parameters and the trainer; `phases` gets seconds."""
    clock = Laps({} if phases is None else phases)
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    if par.tp > 1 and not par.sp:
        # megatron-core's MoE refuses TP without SP, and MLA sums the RoPE key's grad only through SP's gather
        raise RlsmokeError(f"tp={par.tp} trains only with sequence parallelism", rule="megatron.layout",
                           fix="turn sequence parallelism on (Megatron's --sequence-parallel)")  # fmt: skip
    compute_dtype, master_dtype = TORCH_DTYPES[cfg.train_compute_dtype], TORCH_DTYPES[cfg.train_dtype]
    with unfilled():  # every parameter is loaded below (strict)
        gpt = build_gpt(spec, par, params_dtype=compute_dtype, device=device)
    clock("build")
    # One process on a GPU: the bridge's conversion runs on the device.
    src = (
        {k: v.to(device) for k, v in hf.items()} if device.startswith("cuda") and par.world_size == 1 else hf
    )
    # Tensors move in their own dtype when the main dtype holds every value (bf16 or fp32 into fp32): bit
    # for bit what casting first gave, without a whole-model pass; fp32 into bf16 is rounded first.
    if not all(torch.promote_types(v.dtype, master_dtype) == master_dtype for v in src.values()):
        src = {k: v.to(master_dtype) for k, v in src.items()}
    full = hf_to_megatron(src, spec, vocab_size=gpt.vocab_size, defect=defect)
    state = shard(full, spec, hf, par, rank) if par.world_size > 1 else full
    # a tensor the bridge passed through untouched may be held by a rollout copy built from the same read
    borrowed = {v.untyped_storage().data_ptr() for v in src.values()}
    del src
    model = gpt
    if gpt.config.bf16:
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(gpt.config, gpt)  # Megatron's bf16 model: every parameter and buffer in bf16
    gpt.load_state_dict(state, strict=True)  # rounds into the compute dtype
    with torch.no_grad():  # the router's expert bias stays fp32 (Miles keeps it so; HF holds it in fp32)
        for name, bias in gpt.named_buffers():
            if name.endswith("expert_bias"):
                bias.data = _owned(state[name].to(device), torch.float32, borrowed)
    pairs = [
        (p, _owned(state[name].to(device), master_dtype, borrowed)) for name, p in gpt.named_parameters()
    ]
    del full, state  # the bridge's whole state goes before DDP allocates its grad buffers
    clock("convert")
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False)
    with device_shim(device):  # its grad buffers go where `torch.cuda.current_device()` says
        ddp = DistributedDataParallel(gpt.config, ddp_config, model)
    trainer = MegatronTrainer(HFStyle(ddp, spec.vocab_size, device, par), gpt, ddp, pairs, par, cfg, device)
    clock("trainer setup")
    return trainer


def _owned(t: torch.Tensor, dtype: torch.dtype, borrowed: set[int]) -> torch.Tensor:
    """`t` in `dtype` in a storage of its own: a cast already is; a tensor of the checkpoint's is copied."""
    out = t.to(dtype)
    return out.clone() if out.untyped_storage().data_ptr() in borrowed else out


def gather_hf_weights(trainer: MegatronTrainer, spec: ModelSpec, hf: dict[str, torch.Tensor],
                      dtype: torch.dtype, defect: str | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """Every rank's compute parameters gathered in `dtype` into HF tensors; each rank holds a rollout copy."""
    par = trainer.par
    mine = {k: v.detach().to(dtype) for k, v in rank_state(trainer.gpt).items()}
    if par.world_size == 1:
        states = [mine]
    else:
        states = [{} for _ in range(par.world_size)]
        for name in sorted(mine):  # every rank holds the same names and shapes (local expert indices)
            parts = [torch.empty_like(mine[name]) for _ in range(par.world_size)]
            dist.all_gather(parts, mine[name].contiguous())
            for r, t in enumerate(parts):
                states[r][name] = t.cpu()
    return megatron_to_hf(unshard(states, spec, hf, par), spec, hf, defect=defect)


class MegatronTrainWorker:
    """World size 1, in the driver's process: what `rlsmoke run --trainer megatron` colocates."""

    def __init__(self, cfg: RunConfig, ckpt: Path):
        if not available():
            raise RlsmokeError("trainer=megatron needs megatron-core, which is not installed",
                               rule="engine.megatron", fix="pip install 'rlsmoke[megatron]'")  # fmt: skip
        self.spec, self.par = cfg.spec, Parallel()
        self.defect = cfg.inject.kind if cfg.inject.kind.startswith("bridge-") else None
        self.load_phases: dict[str, float] = {}  # summary.json timing.load_phases_s
        clock = Laps(self.load_phases)
        for name in MODULES:  # imported with the engine by `rlsmoke run`; a caller's own here
            importlib.import_module(name)
        clock("megatron import")
        if not dist.is_initialized():
            init(0, self.par, backend=backend_for(cfg.device))
        clock("process group")
        hf = read_checkpoint(ckpt, cfg.device)  # on a GPU straight onto it, where the bridge converts
        clock("read")
        self.trainer = build_rank(self.spec, hf, self.par, 0, cfg=cfg, device=cfg.device, defect=self.defect,
                                  phases=self.load_phases)  # fmt: skip
        self.hf = {k: v.to("meta") for k, v in hf.items()}  # the bridge needs only the names from here on
        self._read: dict[str, torch.Tensor] | None = hf  # until the rollout copy is built from it

    def take_checkpoint(self) -> dict[str, torch.Tensor] | None:
        """The checkpoint's tensors as read, once, for the colocated rollout copy (0.7 s on GLM-5 4-layer)."""
        read, self._read = self._read, None
        return read

    def parallel(self) -> dict:
        return self.par.executed()

    def hf_weights(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The trainer's weights under HF checkpoint names: Megatron -> HF through the bridge."""
        return gather_hf_weights(self.trainer, self.spec, self.hf, dtype, self.defect)

    def rollout_weights(self, model, dtype: torch.dtype):
        """What the rollout engine should hold, under its in-memory names (fused experts stacked)."""
        return in_memory_weights(model, self.hf_weights(dtype), dtype)


def in_memory_weights(model, disk: dict[str, torch.Tensor], dtype: torch.dtype):
    """HF checkpoint tensors -> the HF model's parameters, experts fused as transformers fuses them."""
    for name, p in model.named_parameters():
        if name in disk:
            t = disk[name]
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            base, kind = name.rsplit(".", 1)
            parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
            t = torch.stack(
                [torch.cat([disk[f"{base}.{e}.{w}.weight"] for w in parts]) for e in range(len(p))]
            )
        else:
            raise RlsmokeError(
                f"rollout parameter {name} has no HF checkpoint tensor", rule="bridge.hf_names"
            )
        if t.shape != p.shape:
            raise RlsmokeError(f"rollout parameter {name} is {tuple(p.shape)}, the bridge gives {tuple(t.shape)}",
                               rule="bridge.hf_shapes")  # fmt: skip
        yield name, t.to(dtype)
