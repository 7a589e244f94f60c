"""Prune a real sharded HF checkpoint to its first dense and first MoE layers, renumbered. Bytes are copied,
never decoded (bf16 and FP8 alike); per-layer config lists keep the kept layers' entries."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from rlsmoke.checkpoints.safety import atomic_dir, check_target
from rlsmoke.checkpoints.shards import (
    DEFAULT_MAX_SHARD_BYTES,
    TensorPlan,
    load_index,
    read_chunk,
    tensors_in_order,
    write_derived,
)
from rlsmoke.checkpoints.verification import verify
from rlsmoke.errors import CheckpointError

_LAYER = re.compile(r"^(.*?(?:^|\.)layers\.)(\d+)(\..*)$")


def layer_map(text_cfg: dict, dense: int, moe: int, keep_mtp: bool, mtp_layers: set[int]) -> dict[int, int]:
    """{source layer: new layer} for the first `dense` dense and first `moe` MoE layers (+ MTP)."""
    n = text_cfg["num_hidden_layers"]
    kinds = text_cfg.get("mlp_layer_types") or [
        "dense" if i < text_cfg.get("first_k_dense_replace", 0) else "sparse" for i in range(n)
    ]
    dense_src = [i for i, k in enumerate(kinds) if k == "dense"]
    moe_src = [i for i, k in enumerate(kinds) if k != "dense"]
    if dense > len(dense_src) or moe > len(moe_src):
        raise CheckpointError(
            f"config.json: prune to {dense} dense + {moe} MoE layers asks for more than the source has "
            f"({len(dense_src)} dense + {len(moe_src)} MoE)",
            rule="checkpoint.prune",
            fix="ask for at most the layers the source checkpoint has",
        )
    kept = sorted(dense_src[:dense] + moe_src[:moe])
    mapping = {old: new for new, old in enumerate(kept)}
    if keep_mtp:
        mapping.update({old: len(kept) + old - n for old in sorted(mtp_layers)})
    return mapping


def rename(name: str, mapping: dict[int, int]) -> str | None:
    """The tensor's name after pruning, or None when its layer is dropped."""
    if not (m := _LAYER.match(name)) or "visual" in m.group(1):
        return name
    new = mapping.get(int(m.group(2)))
    return None if new is None else f"{m.group(1)}{new}{m.group(3)}"


def pruned_config(cfg: dict, mapping: dict[int, int], dense: int, moe: int, keep_mtp: bool) -> dict:
    cfg = json.loads(json.dumps(cfg))
    text = cfg.get("text_config") or cfg
    n = text["num_hidden_layers"]
    kept = [old for old, _ in sorted(mapping.items(), key=lambda kv: kv[1]) if old < n]
    for key, value in list(text.items()):
        if isinstance(value, list) and len(value) == n:
            text[key] = [value[i] for i in kept]
    text["num_hidden_layers"] = dense + moe
    if "first_k_dense_replace" in text:
        text["first_k_dense_replace"] = dense
    if not keep_mtp and "num_nextn_predict_layers" in text:
        text["num_nextn_predict_layers"] = 0
    q = cfg.get("quantization_config") or {}
    if "modules_to_not_convert" in q:
        kept_modules = (rename(m + ".", mapping) for m in q["modules_to_not_convert"])
        q["modules_to_not_convert"] = [m[:-1] for m in kept_modules if m]
    return cfg


def prune(
    src: Path | str,
    out: Path | str,
    dense: int,
    moe: int,
    *,
    keep_mtp: bool = False,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
) -> Path:
    """Write the pruned copy of checkpoint `src` into `out`, atomically; returns `out`."""
    src, out = Path(src), Path(out)
    check_target(out, force)
    plans, cfg = pruned_plans(src, dense, moe, keep_mtp)
    with atomic_dir(out, sum(p.nbytes for p in plans), force=force) as tmp:
        write_derived(tmp, src, plans, cfg, "prune", max_shard_bytes=max_shard_bytes, progress=progress)
    return out.absolute()


def pruned_plans(src: Path, dense: int, moe: int, keep_mtp: bool) -> tuple[list[TensorPlan], dict]:
    """The kept tensors, renamed, as copies from `src`; and the pruned config.json."""
    verify(src, checksums=False, config=False)  # structure only: a corrupt source fails here, by name
    cfg = json.loads((src / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    weight_map = load_index(src)
    n = text["num_hidden_layers"]
    mtp = {int(m.group(2)) for k in weight_map if (m := _LAYER.match(k)) and int(m.group(2)) >= n}
    mapping = layer_map(text, dense, moe, keep_mtp, mtp)
    plans = [
        TensorPlan(new, entry.dtype, entry.shape, functools.partial(read_chunk, shard, entry))
        for shard, name, entry in tensors_in_order(src)
        if (new := rename(name, mapping)) is not None
    ]
    return plans, pruned_config(cfg, mapping, dense, moe, keep_mtp)
