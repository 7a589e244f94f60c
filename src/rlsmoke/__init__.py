"""rlsmoke: one-step end-to-end tests for GRPO post-training of large MoE models. Names load lazily, so
`import rlsmoke` never imports torch."""

from __future__ import annotations

import importlib

from rlsmoke.facts import VERSION as __version__

_LAZY = {
    "Case": "rlsmoke.cases",
    "Plan": "rlsmoke.cases",
    "run_case": "rlsmoke.suite",
    "gates_for": "rlsmoke.gating",
    "GateFailure": "rlsmoke.gating",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlsmoke' has no attribute {name!r}")
