"""The compiled kernels' caches live under $RLSMOKE_CACHE whatever a process imports first.

A case: a fresh interpreter with RLSMOKE_CACHE set and no compile folders chosen.
A run: import an engine module, then transformers' GLM-5 modeling (it imports torch._inductor.config,
which fixes inductor's folder at its import, as megatron-core's import does).
Gates: inductor's and Triton's folders are the cache home's, Triton keeps its autotuning; a folder the
user chose stays. Twin: the modeling imported before the engine leaves inductor in /tmp, which is why the
engine sets the folders at its own import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SHOW = ("import json, os, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        "print(json.dumps({{k: os.environ.get(k) for k in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR', "
        "'TRITON_CACHE_AUTOTUNING')}}))")  # fmt: skip
ENGINE, MODELING = "rlsmoke.engine.rollout", "transformers.models.glm_moe_dsa.modeling_glm_moe_dsa"


def _folders(tmp_path, modules, **chosen) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env |= {"RLSMOKE_CACHE": str(tmp_path), **chosen}
    out = subprocess.run([sys.executable, "-c", SHOW.format(modules=modules)], env=env, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return json.loads(out.splitlines()[-1])


def test_the_compile_caches_live_in_the_cache_home(tmp_path):
    got = _folders(tmp_path, [ENGINE, MODELING])
    assert got == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                   "TRITON_CACHE_DIR": str(tmp_path / "triton"), "TRITON_CACHE_AUTOTUNING": "1"}  # fmt: skip


def test_a_folder_the_user_chose_stays(tmp_path):
    got = _folders(tmp_path, [ENGINE, MODELING], TORCHINDUCTOR_CACHE_DIR="/elsewhere/inductor",
                   TRITON_CACHE_DIR="/elsewhere/triton")  # fmt: skip
    assert (got["TORCHINDUCTOR_CACHE_DIR"], got["TRITON_CACHE_DIR"]) == (
        "/elsewhere/inductor",
        "/elsewhere/triton",
    )


def test_torchs_compiler_imported_first_fixes_inductors_folder_elsewhere(tmp_path):
    got = _folders(tmp_path, [MODELING, ENGINE])
    folder = os.path.basename(got["TORCHINDUCTOR_CACHE_DIR"])  # inductor's default: /tmp/torchinductor_USER
    assert folder.startswith("torchinductor_"), got
