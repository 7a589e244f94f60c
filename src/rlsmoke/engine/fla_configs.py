"""fla's tuned kernel configs for the GPUs rlsmoke was tuned on: there a run skips Triton's autotune (most
of the Flash run's first five minutes on a fresh H200). fla (>= 0.6, `fla/ops/utils/cache.py`) looks a
config up in `$FLA_CONFIG_DIR/<kernel>.json` first; `bench/gpu_fla_configs.sh` records them with the fla
version. A user's own FLA_CONFIG_DIR or FLA_CACHE_MODE wins."""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import json
import os
import re
import warnings
import weakref
from pathlib import Path

from rlsmoke.shipped import FIXTURES

SHIPPED = FIXTURES / "fla_configs"
# exact key first, then one of the same structure at other lengths, then Triton's autotune
MODE = "fuzzy"
PROVENANCE = "provenance.json"


def gpu_folder(device_name: str) -> str:
    """fla's own folder name for a GPU (`sanitize_gpu_name`): "NVIDIA H200" -> "NVIDIA_H200"."""
    return re.sub(r"[^0-9A-Za-z]+", "_", device_name).strip("_") or "unknown_gpu"


def fla_version() -> str:
    for dist in ("fla-core", "flash-linear-attention"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return ""


def select(device_name: str, version: str, shipped: Path = SHIPPED) -> tuple[Path | None, str]:
    """The shipped folder for this GPU and fla version, or None and why fla will autotune."""
    folder = shipped / gpu_folder(device_name)
    try:
        recorded = json.loads((folder / PROVENANCE).read_text())
    except (OSError, ValueError):
        tuned = sorted(p.name for p in shipped.iterdir() if p.is_dir()) if shipped.is_dir() else []
        return None, f"no configs recorded for {folder.name} (tuned: {', '.join(tuned) or 'none'})"
    if recorded.get("fla") != version:
        why = f"configs for {folder.name} were recorded with fla {recorded.get('fla')}, this is fla {version}"
        return None, why
    return folder, f"recorded on {recorded.get('gpu')} with fla {version} ({recorded.get('date')})"


def use(device_name: str) -> dict:
    """Point fla at the shipped configs for `device_name` if there are any; what the summary records."""
    if "FLA_CONFIG_DIR" in os.environ or "FLA_CACHE_MODE" in os.environ:
        env = os.environ
        return {"source": "user", "dir": env.get("FLA_CONFIG_DIR"), "mode": env.get("FLA_CACHE_MODE")}
    folder, reason = select(device_name, fla_version())
    if folder is None:
        return {"source": "autotune", "reason": reason}
    os.environ["FLA_CONFIG_DIR"], os.environ["FLA_CACHE_MODE"] = str(folder), MODE
    import fla.ops.kda  # noqa: F401  (every KDA kernel decorated)
    from fla.ops.utils import cache

    # fla reads FLA_CACHE_MODE once, at import, before a run can set it: the lookups read it per call
    cache.FLA_CACHE_MODE = cache.FlaCacheMode(MODE)
    # Triton's plain autotuner never looks at the files: make those kernels fla's cached one
    for tuner, kernel in autotuners():
        if not isinstance(tuner, cache.CachedAutotuner):
            tuner.__class__, tuner.kernel_name = cache.CachedAutotuner, kernel
    return {"source": "shipped", "dir": folder.name, "mode": MODE, "reason": reason}


def instances_of(cls) -> list:
    """The live objects of `cls` the collector tracks. A dead weak proxy among them (torch.compile leaves
    some) raises ReferenceError at any isinstance, so proxies are passed over by their type."""
    with warnings.catch_warnings():  # isinstance on a deprecated module attribute warns
        warnings.simplefilter("ignore")
        return [
            obj for obj in gc.get_objects() if type(obj) not in weakref.ProxyTypes and isinstance(obj, cls)
        ]


def autotuners():
    """fla's autotuned kernels in this process, with the name fla files their configs under."""
    from triton.runtime.autotuner import Autotuner

    for obj in instances_of(Autotuner):
        fn = obj.fn
        while hasattr(fn, "fn"):
            fn = fn.fn
        if (getattr(fn, "__module__", "") or "").startswith("fla."):
            # the name CachedAutotuner files it under
            yield obj, obj.fn.fn.__name__ if hasattr(obj.fn, "fn") else obj.fn.__name__


def entry(key: tuple, config) -> tuple[str, dict]:
    """One `autotune_entries` item in fla's file format (its hash of the key, the key, the config)."""
    from fla.ops.utils.cache import AutotuneKey

    cfg = {"kwargs": dict(config.kwargs), "num_warps": config.num_warps, "num_stages": config.num_stages,
           "num_ctas": getattr(config, "num_ctas", 1), "maxnreg": getattr(config, "maxnreg", None)}  # fmt: skip
    return AutotuneKey.key_hash(key), {"autotune_key": AutotuneKey.normalize_autotune_key(key), "config": cfg}


def record(out: Path, provenance: dict) -> None:
    """Write this process's autotune choices as fla config files in `out`, merged with what is there."""
    import triton

    chosen: dict[str, dict[tuple, object]] = {}  # {kernel: {key: triton.Config}}
    for tuner, kernel in autotuners():
        if tuner.cache:
            chosen.setdefault(kernel, {}).update(tuner.cache)
    out.mkdir(parents=True, exist_ok=True)
    for kernel, choices in sorted(chosen.items()):
        path = out / f"{kernel}.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        entries = data.get("autotune_entries", {})
        entries.update(entry(key, cfg) for key, cfg in choices.items())
        data = {"kernel_name": kernel, "triton_version": triton.__version__, "autotune_entries": entries}
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    kernels = sorted(p.stem for p in out.glob("*.json") if p.name != PROVENANCE)
    (out / PROVENANCE).write_text(json.dumps({**provenance, "kernels": kernels}, indent=1) + "\n")
