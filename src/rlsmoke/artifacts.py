"""A test's artifacts folder plus the session's launch choices, as the plugin hands it to a test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.platforms import Host


@dataclass
class Artifacts:
    """A test's artifacts folder plus the session's launch choices. `os.fspath()` gives the folder."""

    path: Path
    launcher: str = "builtin"
    trainer: str = "fsdp"  # --trainer: the built-in engine's trainer (fsdp: HF modeling code; megatron)
    host: Host = Host("cpu", "CPU", 0)
    num_gpus: int | None = None  # --num-gpus / NUM_GPUS when given: replaces the module's NUM_GPUS
    miles_root: Path | None = None
    model_dir: Path | None = None
    lease: object | None = None  # launch.lease.GpuLease
    ports: object | None = None  # launch.lease.PortLease
    timeout: float | None = None
    update_golden: bool = False
    history: Path | None = None
    trusted: bool = False
    history_shadow: bool = False  # report the band (a warning, the summary) but never fail on it: PR runs
    commit: str = "unknown"
    warm: object | None = None  # launch.warm.WarmServer: CPU runs fork from it instead of starting cold
    record_property: Callable[[str, object], None] = field(default=lambda k, v: None, repr=False)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, other) -> Path:
        return self.path / other
