"""A run's seconds: its laps before the first seed, each engine call's by phase, the offload moves as
their own, and the one-line summary."""

from __future__ import annotations

import sys
import time


class Laps:
    """Each call adds the seconds since the last one to `phases` under its name (device work finished)."""

    def __init__(self, phases: dict[str, float]):
        self.phases, self.last = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        torch = sys.modules.get("torch")  # not imported yet: no device work to wait for
        if torch is not None and torch.cuda.is_initialized():  # asks without starting the driver
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now


class PhaseClock:
    """Wall seconds of each engine call of a seed, summed over its rollouts (calls return host values)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, phase: str, call, *args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start


def phase_seconds(called: dict[str, float], moved: dict[str, float]) -> dict[str, float]:
    """A seed's seconds by phase: the engine calls less their offload moves (`offload`)."""
    asked_by = {"rollout": "rollout", "forward_only": "train", "train_step": "step", "sync": "sync"}
    out = {phase: max(0.0, s - moved.get(asked_by[phase], 0.0)) for phase, s in called.items()}
    out["offload"] = sum(moved.values())
    return out


def describe_timing(timing: dict) -> str:
    """One line: load, each seed, and the first seed's phases."""
    seeds = ", ".join(f"{s:.1f}" for s in timing["per_seed_s"])
    phases = " ".join(f"{k} {v:.1f}" for k, v in timing.get("phases_s", {}).items())
    compile_s = f", KDA compile {timing['compile_s']:.1f} s" if timing.get("compile_s") else ""
    return (f"load {timing.get('load_s', 0):.1f} s (checkpoint {timing.get('checkpoint_s', 0):.1f} s{compile_s}); "
            f"per seed [{seeds}] s; first seed: {phases}")  # fmt: skip
