"""Where rlsmoke keeps what it builds once: $RLSMOKE_CACHE, else ~/.cache/rlsmoke."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home(cache_dir: Path | str | None = None) -> Path:
    return Path(cache_dir or os.environ.get("RLSMOKE_CACHE") or Path.home() / ".cache" / "rlsmoke")
