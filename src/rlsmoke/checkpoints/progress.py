"""A byte progress bar for the checkpoint writers and the verifier. No torch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A tqdm byte counter's `update` when asked for, else None: the writer's progress callback."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # no monitor thread: it would outlive the bar and turn rank forks off

    with Bar(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024) as bar:
        yield bar.update
