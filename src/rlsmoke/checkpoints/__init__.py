"""Offline checkpoints, imported lazily so `import rlsmoke.checkpoints` pulls in no torch."""

from __future__ import annotations

import importlib

_API = {
    "prepare": "rlsmoke.checkpoints.cache",
    "prepare_to": "rlsmoke.checkpoints.cache",
    "synthesize": "rlsmoke.checkpoints.synthesis",
    "prune": "rlsmoke.checkpoints.pruning",
    "patch": "rlsmoke.checkpoints.dialects",
    "fp8": "rlsmoke.checkpoints.quantize",
    "verify": "rlsmoke.checkpoints.verification",
}
__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
