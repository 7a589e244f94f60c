"""The import-only stand-ins of Miles' H200 site (bench/miles_overlay): every name imports, every use
raises and is logged, even when a caller swallows the error; nothing stands in for more than it names."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

OVERLAY = Path(__file__).resolve().parents[2] / "bench" / "miles_overlay"


def python(code: str, tmp_path: Path, site: Path | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with the overlay first on sys.path: the stand-ins must not leak into
    the test process, where a stand-in polars would shadow nothing but confuse everything."""
    path = os.pathsep.join(str(p) for p in (OVERLAY, site) if p)
    env = {**os.environ, "PYTHONPATH": path, "RLSMOKE_STANDIN_LOG": str(tmp_path / "standin.log")}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_names_import_and_every_use_raises_and_is_logged(tmp_path):
    code = """
import polars as pl, sgl_kernel
from sgl_kernel.quantization import fp8_scaled_mm
from sgl_kernel.scalar_types import scalar_types
from mooncake.engine import TransferEngine
from rlsmoke_standin import StandInUsed
def subclass():
    class Kernel(sgl_kernel.Base):
        pass
dtypes = dict(a=pl.Int32, b=scalar_types.uint4b8, c=fp8_scaled_mm | None)  # reads, as at import time
for use in (lambda: TransferEngine(), lambda: pl.DataFrame([]), lambda: list(sgl_kernel.ops),
            subclass):
    try:
        use()
    except StandInUsed:
        pass  # swallowed, as a caller might: the log still tells
    else:
        raise SystemExit("a use did not raise")
print("ok")
"""
    done = python(code, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    log = (tmp_path / "standin.log").read_text().splitlines()
    assert [line.split("\t")[:2] for line in log] == [
        ["mooncake.engine.TransferEngine", "called"],
        ["polars.DataFrame", "called"],
        ["sgl_kernel.ops", "iterated over"],
        ["sgl_kernel.Base", "subclassed"],
    ]


def test_a_clean_import_logs_nothing(tmp_path):
    done = python(
        "import inspect, pickle, polars, sgl_kernel.x; inspect.getmodule(polars); print('ok')", tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "standin.log").exists()


def test_mooncake_stands_in_for_its_engine_only(tmp_path):
    # Miles picks its object store by whether mooncake.store imports: a stand-in there would choose Mooncake
    done = python("import mooncake.store", tmp_path)
    assert done.returncode == 1 and "No module named 'mooncake.store'" in done.stderr


def fake_site(root: Path) -> Path:
    site = root / "site"
    for rel, text in {
        "sglang_router/__init__.py": "",
        "sglang/srt/distributed/parallel_state.py": "GROUP = None\n",
        "sglang/srt/model_loader/__init__.py": "",
    }.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    for pkg in ("sglang", "sglang/srt", "sglang/srt/distributed"):
        (site / pkg / "__init__.py").touch()
    return site


def install(site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(OVERLAY / "install_into_site.py"), str(site)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_install_writes_the_fork_names_once_and_they_import(tmp_path):
    site = fake_site(tmp_path)
    assert install(site).returncode == 0 and install(site).returncode == 0  # idempotent
    assert (site / "sglang/srt/distributed/parallel_state.py").read_text().count("ParallelismContext =") == 1
    code = """
from sglang.srt.distributed.parallel_state import ParallelismContext, RankParallelismConfig, GROUP
from sglang.srt.model_loader.parameter_mapper import ParameterMapper
from sglang_router.sglang_router_rs import get_available_tool_call_parsers, Router
assert get_available_tool_call_parsers() == [] and GROUP is None
print("ok")
"""
    done = python(code, tmp_path, site)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(
    "real", ["sglang_router/sglang_router_rs.abi3.so", "sglang/srt/model_loader/parameter_mapper.py"]
)
def test_install_refuses_a_site_that_has_the_real_thing(tmp_path, real):
    site = fake_site(tmp_path)
    (site / real).write_text("class ParameterMapper: pass\n")
    done = install(site)
    assert done.returncode == 1 and "[overlay.real]" in done.stderr
