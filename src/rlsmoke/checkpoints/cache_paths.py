"""Where rlsmoke keeps what it builds once: $RLSMOKE_CACHE, else ~/.cache/rlsmoke."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home(cache_dir: Path | str | None = None) -> Path:
    return Path(cache_dir or os.environ.get("RLSMOKE_CACHE") or Path.home() / ".cache" / "rlsmoke")


def keep_compiled_kernels() -> None:
    """inductor's and Triton's caches (Triton's autotuning choices too, Triton >= 3.3) under the cache home,
    so a machine compiles a shape once, unless the user chose folders."""
    home = cache_home()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(home / "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", str(home / "triton"))
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
