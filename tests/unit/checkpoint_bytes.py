"""Byte-exact comparison of two checkpoints: every tensor's dtype, shape and raw bytes."""

from __future__ import annotations

from pathlib import Path

import torch

from rlsmoke.checkpoints.shards import load_index, read_header, read_tensor


def raw_tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """{name: (dtype, shape, raw bytes)} of every tensor of a checkpoint."""
    folder = Path(folder)
    out = {}
    for name, shard in load_index(folder).items():
        entry = read_header(folder / shard)[name]
        data = read_tensor(folder / shard, entry).view(torch.uint8).numpy().tobytes()
        out[name] = (entry.dtype, tuple(entry.shape), data)
    return out
