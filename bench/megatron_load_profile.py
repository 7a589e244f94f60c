"""The megatron trainer's load, phase by phase, at the full width of GLM-5 4-layer 1-GPU cut to fit a host.

A CPU has neither the memory nor the time for the whole model (5.7 B parameters; the load holds the
checkpoint, the bridge's fp32 state, the compute copy and the fp32 main parameters at once), so the
model keeps its full width (hidden 6144, MLA ranks, DSA indexer) and loses layers, experts and vocab
rows (`--layers`, `--experts`, `--vocab`). The phases are those of `timing.load_phases_s`; each is
also given per million parameters, to extrapolate to the whole model. A synthetic bf16 checkpoint
(random values of the expected layout) is written once under --dir.

    python bench/megatron_load_profile.py --dir /tmp/mg-full [--profile OUT.prof] [--device cuda]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import time
from pathlib import Path

import torch

CASE = "glm5-744b-a40b-4layer-1gpu"


def reduced_spec(layers: int, experts: int, vocab: int):
    from rlsmoke.models import model_spec

    spec = model_spec(CASE)
    return spec.replace(num_layers=layers, first_k_dense=min(spec.first_k_dense, layers - 1),
                        num_experts=experts, vocab_size=vocab)  # fmt: skip


def write_checkpoint(spec, folder: Path) -> None:
    from safetensors.torch import save_file

    from rlsmoke.checkpoints.synthesis import expected_layout
    from rlsmoke.models.hf import hf_config

    if (folder / "model.safetensors").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(spec)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, (_, shape) in expected_layout(cfg).tensors.items():
        tensors[name] = (torch.rand(shape, generator=g) * 0.02 - 0.01).to(torch.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"))
    cfg.save_pretrained(folder)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compute-dtype", default="bfloat16")
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()

    t0 = time.perf_counter()
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.parallel_state  # noqa: F401

    import_s = time.perf_counter() - t0
    from rlsmoke.bridge.convert import Parallel
    from rlsmoke.engine.config import RunConfig
    from rlsmoke.engine.megatron import dist
    from rlsmoke.engine.megatron.trainer import build_rank
    from rlsmoke.engine.model import load_policy, process_settings
    from rlsmoke.engine.read import read_checkpoint
    from rlsmoke.engine.timing import Laps

    spec = reduced_spec(args.layers, args.experts, args.vocab)
    write_checkpoint(spec, args.dir)
    process_settings(None)
    cfg = RunConfig(case=CASE, tiny=False, trainer="megatron", device=args.device,
                    rollout_dtype="bfloat16", compute_dtype=args.compute_dtype)  # fmt: skip
    phases: dict[str, float] = {"megatron import": import_s}
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    clock = Laps(phases)
    dist.init(0, Parallel(), backend=dist.backend_for(args.device))
    clock("process group")
    hf = read_checkpoint(args.dir, args.device)
    clock("read")
    trainer = build_rank(spec, hf, Parallel(), 0, cfg=cfg, device=args.device, phases=phases)
    clock = Laps(phases)
    load_policy(args.dir, spec, "bfloat16", args.device, state=hf)  # from the trainer's read, as the run does
    clock("rollout copy")
    if prof:
        prof.disable()
        prof.dump_stats(args.profile)
    params = sum(p.numel() for p in trainer.gpt.parameters())
    print(json.dumps({"parameters_m": round(params / 1e6, 1), "phases_s": {k: round(v, 3) for k, v in phases.items()},
                      "s_per_billion": {k: round(v / params * 1e9, 3) for k, v in phases.items()}}))  # fmt: skip
    dist.close()


if __name__ == "__main__":
    main()
