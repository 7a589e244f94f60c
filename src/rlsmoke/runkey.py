"""The run key (case, platform, device class, launcher, dtype, width, GPU count) that thresholds, calibration
and history are keyed by; the device is the caller's, never detected here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass, fields

from rlsmoke.errors import RlsmokeError


def default_dtype(platform: str) -> str:
    """rollout/train dtypes: fp32 throughout on CPU; a bf16 rollout over fp32 master weights on GPUs."""
    return "float32/float32" if platform == "cpu" else "bfloat16/float32"


def gpu_count(n) -> str:
    """'*' for one device (which also stands for any count not calibrated on its own), else the count."""
    return "*" if n in (None, "", "*") or int(n) <= 1 else str(int(n))


@dataclass(frozen=True)
class RunKey:
    case: str
    platform: str = "cpu"
    device: str = "CPU"
    launcher: str = "builtin"
    dtype: str = ""  # "": the platform's default
    width: str = ""  # "tiny" | "full"; "": tiny on CPU, full on GPUs
    # FSDP2 reduces grads in bf16: an entry calibrated at N wins at N
    num_gpus: str = "*"

    def __post_init__(self):
        if not self.dtype:
            object.__setattr__(self, "dtype", default_dtype(self.platform))
        if not self.width:
            object.__setattr__(self, "width", "tiny" if self.platform == "cpu" else "full")

    @classmethod
    def from_summary(cls, summary: Mapping, *, case: str | None = None, platform: str | None = None,
                     device: str | None = None) -> RunKey:  # fmt: skip
        """The key a summary.json (or a record's meta) names; the keywords fill what it does not say."""
        name = summary.get("case") or case
        platform = summary.get("platform") or platform or "cpu"
        device = summary.get("device") or device or ("CPU" if platform == "cpu" else None)
        if name is None or device is None:
            missing = "case" if name is None else "device"
            raise RlsmokeError(f"the run's summary names no {missing} (platform={platform})", rule="runkey.fields",
                               fix=f"write `{missing}` into the run's summary.json, or pass it in")  # fmt: skip
        dtype = summary.get("dtype")  # the engine's summary: {"rollout": r, "train": t, ...}, keyed "r/t"
        if isinstance(dtype, Mapping):
            dtype = f"{dtype.get('rollout')}/{dtype.get('train')}"
        return cls(str(name), platform, device, summary.get("launcher") or "builtin",
                   dtype or "", summary.get("width") or "",
                   gpu_count(summary.get("num_gpus")))  # fmt: skip

    @classmethod
    def of_case(cls, case, *, device: str, launcher: str = "builtin") -> RunKey:
        """The key of a `Case` run on `device` (a device class: "CPU", "H200", ...)."""
        return cls(case.name, case.platform, device, launcher, "", "tiny" if case.tiny else "full",
                   gpu_count(case.num_gpus))  # fmt: skip

    def to_json(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_json().items())

    def series(self) -> tuple[str, ...]:
        """(case, platform, device, launcher): what a history band is computed over."""
        return astuple(self)[: len(SERIES)]


FIELDS = tuple(f.name for f in fields(RunKey))
SERIES = FIELDS[:4]
