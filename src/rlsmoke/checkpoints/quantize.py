"""FP8 for rollout, as Miles' converter does it: e4m3fn in 128x128 blocks with a weight_scale_inv
(amax / 448). DSA models' config says scale_fmt "ue8m0", so their scale is rounded up to a power of two."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from rlsmoke.checkpoints.safety import atomic_dir, check_target
from rlsmoke.checkpoints.shards import (
    CHUNK_BYTES,
    DEFAULT_MAX_SHARD_BYTES,
    TensorPlan,
    read_chunk,
    read_tensor,
    tensor_bytes,
    tensors_in_order,
    write_derived,
)
from rlsmoke.checkpoints.verification import BLOCK, verify
from rlsmoke.errors import CheckpointError

FP8_MAX = 448.0  # largest finite e4m3fn
# Kept in bf16, from models.md; `shared_head.head` is the MTP layer's own lm_head.
SKIP = tuple(
    "norm embed mlp.gate. lm_head shared_head.head eh_proj indexer.weights_proj visual vision".split()
)
FLOAT_SOURCES = ("BF16", "F16", "F32")


def quantize_blocks(w: torch.Tensor, *, ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q e4m3fn like w, scale_inv fp32 of shape ceil(w.shape / 128)); w ~= q * scale_inv per block."""
    r, c = w.shape
    nr, nc = -(-r // BLOCK), -(-c // BLOCK)
    wp = w.to(torch.float32, copy=True)  # our own copy: scaled in place below
    if (r, c) != (nr * BLOCK, nc * BLOCK):
        wp = F.pad(wp, (0, nc * BLOCK - c, 0, nr * BLOCK - r))
    blocks = wp.view(nr, BLOCK, nc, BLOCK)  # (R, 128, C, 128)
    # Two single-dim reductions: on CPU, amax over dims (1, 3) at once is several times slower.
    amax = blocks.abs().amax(dim=3).amax(dim=1)  # (R, C)
    scale = (amax / FP8_MAX).clamp_min(1e-12)
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = blocks.div_(scale[:, None, :, None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(nr * BLOCK, nc * BLOCK)[:r, :c].contiguous(), scale


def fp8(
    src: Path | str,
    out: Path | str,
    *,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
) -> Path:
    """Write an FP8 copy of bf16 checkpoint `src` into `out`, atomically; GPU when there is one."""
    src, out = Path(src), Path(out)
    check_target(out, force)
    plans, cfg = fp8_plans(src)
    with atomic_dir(out, sum(p.nbytes for p in plans), force=force) as tmp:
        fp8_into(tmp, src, plans, cfg, max_shard_bytes=max_shard_bytes, progress=progress)
    return out.absolute()


def fp8_plans(src: Path) -> tuple[list[TensorPlan], dict]:
    """The quantized weights with their scales, the rest copied; and config.json's quantization_config."""
    verify(src, checksums=False, config=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    entries = {name: (shard, e) for shard, name, e in tensors_in_order(src)}
    fp8_already = [f"{shard.name}: {n}" for n, (shard, e) in entries.items() if e.dtype.startswith("F8")]
    if fp8_already:
        raise CheckpointError(
            f"{fp8_already[0]} is already FP8",
            rule="checkpoint.fp8",
            fix="convert the bf16 checkpoint, not an FP8 one",
        )
    ue8m0 = any("indexer" in n for n in entries)

    @functools.lru_cache(maxsize=4)  # the weight's chunks and its scale are written back to back
    def quantized(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        path, e = entries[name]
        q, s = quantize_blocks(read_tensor(path, e).to(device), ue8m0=ue8m0)
        return q.cpu(), s.cpu()

    def fp8_chunk(name: str, i: int) -> memoryview:
        flat = quantized(name)[0].view(torch.uint8).reshape(-1)
        return tensor_bytes(flat[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES])

    def scale_chunk(name: str, i: int) -> memoryview:  # a scale is one chunk
        return tensor_bytes(quantized(name)[1])

    plans, skipped = [], []
    for name, (path, e) in entries.items():
        matrix = name.endswith(".weight") and len(e.shape) == 2
        if not matrix or e.dtype not in FLOAT_SOURCES or any(s in name for s in SKIP):
            plans.append(TensorPlan(name, e.dtype, e.shape, functools.partial(read_chunk, path, e)))
            if matrix:
                skipped.append(name[: -len(".weight")])
            continue
        plans.append(TensorPlan(name, "F8_E4M3", e.shape, functools.partial(fp8_chunk, name)))
        scale_shape = tuple(-(-d // BLOCK) for d in e.shape)
        plans.append(
            TensorPlan(name + "_scale_inv", "F32", scale_shape, functools.partial(scale_chunk, name))
        )
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
        "modules_to_not_convert": sorted(skipped),
        **({"scale_fmt": "ue8m0"} if ue8m0 else {}),
    }
    return plans, cfg


def fp8_into(folder: Path, src: Path, plans: list[TensorPlan], cfg: dict, **options) -> None:
    """`write_derived` with its `options`, on one worker: quantizing a tensor twice in parallel would only
    waste the cores it needs."""
    write_derived(folder, src, plans, cfg, "fp8", workers=1, **options)
