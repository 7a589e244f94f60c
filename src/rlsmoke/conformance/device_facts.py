"""The only fakes the real parsers run under: device facts and import-only modules, never a validator
(see shared/reference/real-parsers.md). The device's capability, properties and memory are the platform's
real values (Megatron asserts capability >= 8 for grouped GEMM; SGLang sizes defaults from memory);
torchvision (a CUDA wheel) and, in the Miles venv, triton are import-only stand-ins.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceFacts:
    name: str
    device: str  # the torch device string SGLang is given
    capability: tuple[int, int]
    memory_mib: int  # what SGLang's get_device_memory_capacity() would report


# One GPU class per platform: the one the platform's presets are written for.
DEVICE_FACTS = {
    "nvidia": DeviceFacts("NVIDIA H200", "cuda", (9, 0), 141 * 1024),
    "rocm": DeviceFacts("AMD Instinct MI300X", "cuda", (9, 4), 192 * 1024),
}


class EmptyModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an empty module for `root` and everything under it."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.root or fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


@functools.cache  # once per process
def stub_torchvision() -> None:
    """Hide the CUDA-only torchvision: transformers must see it as absent before the stand-in exists."""
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available(), "transformers must cache torchvision as unavailable"
    sys.meta_path.insert(0, EmptyModuleFinder("torchvision"))


@functools.cache
def stub_triton() -> None:
    """SGLang's own import-only triton stub, when real triton is not installed (the Miles venv)."""
    if importlib.util.find_spec("triton") is not None:
        return
    # Megatron compiles at import time; torch's inductor must be imported before triton is a stub.
    import torch._inductor.compile_fx  # noqa: F401
    from sglang._triton_stub import install

    install()


def fake_device(platform: str) -> DeviceFacts:
    """What torch.cuda reports about device 0, the platform's GPU: capability and properties, nothing else."""
    import torch

    if platform not in DEVICE_FACTS:
        raise ValueError(
            f"platform={platform!r} has no GPU device facts. Adjust --platform to nvidia or rocm."
        )
    facts = DEVICE_FACTS[platform]
    major, minor = facts.capability
    props = types.SimpleNamespace(
        name=facts.name, major=major, minor=minor, total_memory=facts.memory_mib * 2**20
    )
    torch.cuda.get_device_capability = lambda device=None: facts.capability
    torch.cuda.get_device_properties = lambda device=None: props
    return facts
