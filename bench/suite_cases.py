"""The case each NVIDIA e2e module runs at one GPU (its `CASE` through `resolve.effective_case`), in the
order pytest runs the modules: what a GPU host prepares ahead of `NUM_GPUS=1 pytest -m nvidia tests/e2e`.

    python3 bench/suite_cases.py [MODULE ...]      (default: every tests/e2e/test_*_nvidia.py)
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from rlsmoke.resolve import effective_case


def one_gpu_case(path: Path) -> str | None:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    case = getattr(module, "CASE", None)  # the Miles module names a Miles run, not a case of the engine
    return effective_case(case, 1).name if case is not None else None


def main(paths: list[str]) -> None:
    modules = [Path(p) for p in paths] or sorted(Path("tests/e2e").glob("test_*_nvidia.py"))
    print(" ".join(name for name in map(one_gpu_case, modules) if name))


if __name__ == "__main__":
    main(sys.argv[1:])
