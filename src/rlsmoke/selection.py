"""Which tests run on this host: pure functions of a test's markers, its case and the host. No pytest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlsmoke.engine import megatron
from rlsmoke.engine.config import BUILTIN_ASYNC_GPUS
from rlsmoke.errors import RlsmokeError
from rlsmoke.facts import DEFAULT_TRAINER, GPU_PLATFORMS
from rlsmoke.platforms import VENDOR, Host
from rlsmoke.resolve import effective_case
from rlsmoke.resolve import shortfall as memory_shortfall  # why a GPU case does not fit: a skip reason


@dataclass(frozen=True)
class Requirement:
    """What a test needs, read off its markers: a platform and a GPU count (0 for CPU tests)."""

    platform: str  # "nvidia" | "rocm" | "cpu"
    gpus: int


@dataclass(frozen=True)
class Decision:
    run: bool
    reason: str = ""


class DoesNotFit(Exception):  # noqa: N818  (a skip reason, not an error of the user's)
    """A case the host's devices cannot hold, or the chosen trainer cannot run; the plugin reports it as a skip."""


def requirement(markers: Iterable[str], gpus_marker: int | None, override: int | None) -> Requirement | None:
    """None for a test without a platform marker (a unit test): it always runs."""
    names = set(markers)
    gpu_platforms = [p for p in GPU_PLATFORMS if p in names]
    if len(gpu_platforms) > 1:
        raise RlsmokeError(f"markers={sorted(gpu_platforms)} on one test", rule="markers.platform",
                           fix="mark each test with one of nvidia, rocm (split the test in two)")  # fmt: skip
    if gpu_platforms:
        gpus = override if override is not None else (gpus_marker if gpus_marker is not None else 1)
        return Requirement(gpu_platforms[0], gpus)
    return Requirement("cpu", 0) if "cpu" in names else None


def decide(req: Requirement | None, host: Host, *, launcher: str = "builtin", miles_root: str | None = None,
           case=None, num_gpus: int | None = None, trainer: str = DEFAULT_TRAINER) -> Decision:  # fmt: skip
    """Whether a test needing `req` runs on `host`; the reason names what was needed and found."""
    if req is None:
        return Decision(True)
    ran = effective_case(case, num_gpus) if case is not None else None
    if (why := trainer_refusal(trainer, ran)) or req.platform == "cpu":
        return Decision(not why, why)
    if req.gpus == 0:
        return Decision(
            False, f"needs {VENDOR[req.platform]} GPUs; 0 GPUs asked for (--num-gpus / NUM_GPUS=0)"
        )
    need = f"{req.gpus} {VENDOR[req.platform]} GPU{'s' if req.gpus != 1 else ''}"
    if host.platform != req.platform or host.count < req.gpus:
        return Decision(False, f"needs {need}; found {host.describe()}")
    if launcher == "miles" and not miles_root:
        return Decision(False, f"needs {need} and a Miles checkout: --launcher miles without --miles-root "
                               "(or env MILES_ROOT); pass --miles-root DIR")  # fmt: skip
    if launcher == "builtin" and req.platform == "rocm" and req.gpus != BUILTIN_ASYNC_GPUS:
        return Decision(False, f"needs {need} in async mode; the built-in engine places async on exactly "
                               f"{BUILTIN_ASYNC_GPUS}. Pass --launcher miles --miles-root DIR, or --num-gpus 2")  # fmt: skip
    short = memory_shortfall(ran, host) if ran is not None else ""
    return Decision(not short, short)


def trainer_refusal(trainer: str, case=None, inject: str | None = None) -> str:
    """Why `--trainer` cannot run `case` ("" when it can): megatron needs megatron-core and a model it has."""
    if trainer != "megatron":
        return ""
    if not megatron.available():
        return "--trainer megatron needs megatron-core (pip install 'rlsmoke[megatron]')"
    refusal = megatron.refusal(case.spec(), case.num_gpus, case.mode) if case is not None else ""
    return refusal or megatron.unwired(inject=inject or "")
