"""Import-only stand-ins for packages that Miles' modules import at their top but whose code the
train-only step never runs (docs/miles.md, "Every difference"). Reading a name gives another stand-in;
calling, iterating or subclassing one raises `StandInUsed` and appends a line to $RLSMOKE_STANDIN_LOG, so
a use that some caller swallows still shows in the run's records."""

import importlib.abc
import importlib.machinery
import os
import sys
import types

LOG_VAR = "RLSMOKE_STANDIN_LOG"


class StandInUsed(RuntimeError):
    pass


def used(name: str, how: str):
    log = os.environ.get(LOG_VAR)
    if log:
        with open(log, "a") as f:
            f.write(f"{name}\t{how}\tpid {os.getpid()}\n")
    raise StandInUsed(f"{name} is an import-only stand-in; the train-only step {how} it")


class StandIn:
    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):  # copy, pickle and inspect probe these
            raise AttributeError(attr)
        return StandIn(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        used(self._name, "called")

    def __iter__(self):
        used(self._name, "iterated over")

    def __mro_entries__(self, bases):
        used(self._name, "subclassed")

    def __or__(self, other):  # `Name | None` in an annotation is a read, not a use
        return self

    __ror__ = __or__

    def __repr__(self):
        return f"<stand-in {self._name}>"


def _names(name: str):
    """A module's `__getattr__` (PEP 562): every plain name exists; dunders do not (inspect and pickle probe
    `__file__`, `__wrapped__` ... on every module in sys.modules)."""

    def getattr_(attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{name}.{attr}")

    return getattr_


def standin_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__getattr__ = _names(name)
    return module


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every submodule of `root` (sgl_kernel.quantization, ...) imports as a stand-in module."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = standin_module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def standin_package(name: str) -> None:
    """Make the package `name`, now being imported, a stand-in with stand-in submodules."""
    sys.modules[name].__getattr__ = _names(name)
    sys.meta_path.append(_Finder(name))
