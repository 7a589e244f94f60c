"""A GRPO step through megatron-core on CPU: tiny GLM-5 and GLM-4.5, then the bridge fault twins.

The megatron trainer (`rlsmoke run CASE --trainer megatron`) loads megatron-core's GPTModel through
the bridge, trains one step and syncs back into the HF rollout engine through the bridge. In fp32 on
CPU it must meet the gates calibrated for the HF trainer on the same seeds (same math, same bits
to ~1e-6), so those are its gates here (`launcher="builtin"`). Each bridge defect round-trips
exactly (the weight sync still passes) and must fail the log-prob gate.
Skipped without megatron-core (pip install 'rlsmoke[megatron]').
"""

import json

import pytest

from rlsmoke.engine import megatron
from rlsmoke.engine.cli import gate_run
from rlsmoke.engine.config import RunConfig, parse_inject

pytestmark = [
    pytest.mark.cpu,
    pytest.mark.slow,
    pytest.mark.skipif(not megatron.available(), reason="megatron-core is not installed (pip install rlsmoke[megatron])"),
]


def _run(tmp_path, case, inject=None):
    from rlsmoke.engine.run import execute  # torch and transformers: imported by the test, not at collection

    cfg = RunConfig(case=case, tiny=True, trainer="megatron", inject=parse_inject(inject))
    out = tmp_path / (inject or "clean")
    execute(cfg, out)  # records only
    gate_run(out)  # the verdict, as `rlsmoke run` gives it, into summary.json
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("case", ["glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer"])
def test_one_step_through_megatron_core_passes_the_gates(tmp_path, case):
    summary = _run(tmp_path, case)
    assert summary["verdict"] == "PASS", [g for g in summary["gates"] if not g["passed"]]
    assert summary["metrics"]["sync/mismatched_params"] == 0


@pytest.mark.parametrize(("case", "defect"), [
    ("glm5-744b-a40b-4layer", "bridge-kv-order"),
    ("glm5-744b-a40b-4layer", "bridge-expert-swap"),
    ("glm4.5-355b-a32b-4layer", "bridge-gate-up-order"),
])  # fmt: skip
def test_a_bridge_defect_fails_the_logprob_gate_while_the_sync_passes(tmp_path, case, defect):
    summary = _run(tmp_path, case, defect)
    failed = {g["name"] for g in summary["gates"] if not g["passed"]}
    assert summary["verdict"] == "FAIL" and "logprob_abs_diff" in failed, failed
    assert "weight_sync" not in failed  # symmetric: a round-trip test cannot see it
