"""A byte progress bar for the checkpoint writers and the verifier. No torch."""

from __future__ import annotations


class ProgressBar:
    """A tqdm byte counter when asked for, else nothing; used as the writer's progress callback."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.tqdm = None
        if enabled:
            from tqdm import tqdm

            class Bar(tqdm):
                monitor_interval = 0  # no monitor thread: it would outlive the bar and turn rank forks off

            self.tqdm = Bar(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024)

    def __enter__(self):
        return self if self.tqdm else None

    def __call__(self, n: int) -> None:
        self.tqdm.update(n)

    def __exit__(self, *exc):
        if self.tqdm:
            self.tqdm.close()
