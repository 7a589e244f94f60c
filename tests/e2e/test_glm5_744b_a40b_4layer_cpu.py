"""GLM-5 744B-A40B cut to 4 layers, tiny width: one GRPO step on the built-in engine on CPU, in every CI
run, and its fault twins: each engine fault (`rlsmoke run --inject`) must make its gate fail, by name.

The one-step test and the twins take their records from one `rlsmoke run --variants` (SHARED_RUN: one
load, each variant the same bits as a fresh run of it, tests/unit/test_run_variants.py). Gates no engine
fault reaches (grad_norm, the reward range) have record-level twins in tests/unit/test_suite_gates.py.
"""

import json
from pathlib import Path

import pytest

from rlsmoke.cases import Case
from rlsmoke.suite import CPU_SHARED_VARIANTS, CPU_TWINS, check_fault, gates_for

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
SHARED_RUN = CPU_SHARED_VARIANTS  # the clean run, then each twin's fault


@pytest.mark.cpu
@pytest.mark.slow
def test_one_step(case_record):
    gates_for(CASE).check(case_record)


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize(("variant", "expected"), CPU_TWINS, ids=[v.split("@")[0] for v, _ in CPU_TWINS])
def test_fault_fails_its_gate(rlsmoke_variant_runs, artifacts, variant, expected):
    record = rlsmoke_variant_runs.record(CASE, artifacts, variant)
    failure = check_fault(CASE, record, expected)
    assert (
        json.loads((Path(record.artifacts) / "summary.json").read_text())["inject"] == variant.split("@")[0]
    )
    assert f"artifacts: {record.artifacts}" in str(failure)
