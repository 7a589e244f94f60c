"""Peak device memory by phase, as summary.json reports it."""

from __future__ import annotations

import torch


class MemoryMeter:
    """Peak allocated device memory per phase (`torch.cuda.max_memory_allocated`); None off CUDA."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.on = self.device.type == "cuda"
        self.peaks: dict[str, int] = {}
        # measured from the last reset: process start, or `reset_peak_memory_stats` before loading
        self.phase = "load"

    def enter(self, phase: str) -> None:
        self.close()
        self.phase = phase
        if self.on:
            torch.cuda.reset_peak_memory_stats(self.device)

    def close(self) -> None:
        if self.on:
            peak = torch.cuda.max_memory_allocated(self.device)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), peak)

    def report(self) -> dict[str, float] | None:
        """The peaks since the last report, then a new window: each `--variants` run reports its own."""
        if not self.on:
            return None
        self.close()
        peaks, self.peaks = {k: round(v / 2**30, 2) for k, v in self.peaks.items()}, {}
        torch.cuda.reset_peak_memory_stats(self.device)
        return peaks
