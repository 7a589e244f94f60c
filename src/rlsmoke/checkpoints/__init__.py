"""Offline checkpoints: synthesize, prune, patch, FP8, verify, and the cached `prepare` the engine uses.

Functions are imported lazily so that `import rlsmoke.checkpoints` (and the CLI's argument parsing)
does not pull in torch and transformers.
"""

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
