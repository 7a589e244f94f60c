"""`VariantRuns`: the tests of one case's variants (a module's SHARED_RUN) share one `rlsmoke run --variants`
(one load), run by the test that asks first; each test gates its own variant's records as a run of its own.
"""

import json

import pytest

from rlsmoke.artifacts import Artifacts
from rlsmoke.cases import Case
from rlsmoke.engine import megatron
from rlsmoke.errors import RlsmokeError
from rlsmoke.report import write_session_summary
from rlsmoke.selection import DoesNotFit
from rlsmoke.suite import CaseRun, GateFailure, VariantRuns, gates_for

pytest_plugins = ["pytester"]

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)


def _test_artifacts(path, **kwargs) -> tuple[Artifacts, list]:
    """What the plugin's `artifacts` gives a test: its folder, its junit properties."""
    properties = []
    art = Artifacts(path, record_property=lambda k, v: properties.append((k, v)), **kwargs)
    return art, properties


def _launches(root) -> list[str]:
    return [line for log in root.rglob("pytest-run.log") for line in log.read_text().splitlines()
            if line.startswith("$ ")]  # fmt: skip


def test_the_tests_of_one_case_share_one_run_and_each_gates_its_own(tmp_path):
    twins = VariantRuns(["clean", "stale-weights"])
    (first, _), (second, properties) = (_test_artifacts(tmp_path / name, history=tmp_path / "h.db")
                                        for name in ("test_clean", "test_stale"))  # fmt: skip
    clean = twins.record(CASE, first, "clean")
    stale = twins.record(CASE, second, "stale-weights")
    assert len(_launches(tmp_path)) == 1 and "--variants clean,stale-weights" in _launches(tmp_path)[0]
    assert [json.loads((first.path / slug / "summary.json").read_text())["inject"]
            for slug in ("clean", "stale-weights")] == ["none", "stale-weights"]  # fmt: skip
    assert (
        "artifacts",
        str(first.path / "stale-weights"),
    ) in properties  # the asking test's junit properties
    assert any(k == "train/grad_norm" for k, _ in properties)
    assert clean.ran_with.history is not None and stale.ran_with.history is None  # a fault never reaches it

    gates_for(CASE).check(clean)  # each gated as its own run
    assert json.loads((first.path / "clean" / "summary.json").read_text())["verdict"] == "PASS"
    with pytest.raises(GateFailure, match="weight_sync: sync/mismatched_params") as failure:
        gates_for(CASE).check(stale)
    assert f"artifacts: {first.path / 'stale-weights'}" in str(failure.value)

    again = twins.record(CASE, _test_artifacts(tmp_path / "test_again")[0], "clean")
    assert len(_launches(tmp_path)) == 1 and again.entries == clean.entries  # read, not run again


def test_a_shared_run_that_broke_fails_every_test_that_asks_without_running_again(tmp_path):
    twins = VariantRuns(["clean", "stale-weights"], flags=("--n-samples", "1"))  # refused: no group
    for variant in ("clean", "stale-weights"):
        art, _ = _test_artifacts(tmp_path / variant)
        with pytest.raises(RlsmokeError, match=r"n_samples=1") as refused:
            twins.record(CASE, art, variant)
        assert refused.value.rule == "run.usage"
    assert len(_launches(tmp_path)) == 1


@pytest.mark.skipif(not megatron.available(), reason="megatron-core is not installed")
def test_a_variant_the_trainer_cannot_run_skips_its_test_alone(tmp_path):
    twins = VariantRuns(["clean", "train-dropout=0.1"])
    art = Artifacts(tmp_path / "t", trainer="megatron")
    with pytest.raises(DoesNotFit, match="train-dropout"):
        twins.record(CASE, art, "train-dropout=0.1")
    with pytest.raises(RlsmokeError, match="not one of") as undeclared:
        twins.record(CASE, art, "stale-weights")
    assert undeclared.value.rule == "suite.variants"
    assert not (tmp_path / "t").exists()  # nothing ran


def test_a_bad_declaration_fails_where_it_is_declared():
    with pytest.raises(RlsmokeError, match="stale-weight") as bad:
        VariantRuns(["clean", "stale-weight"])
    assert bad.value.rule == "inject.known"


def test_the_session_summary_leaves_hidden_folders_out(tmp_path):
    for folder, case in (("t1", "a"), (".x/case/clean", "b"), (".t2.rlsmoke-new", "c")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "summary.json").write_text(json.dumps({"case": case}))
    rows = [
        line for line in write_session_summary(tmp_path).read_text().splitlines() if line.startswith("| [")
    ]
    assert len(rows) == 1 and "| a |" in rows[0]


def test_a_one_step_test_that_declares_the_twins_run_reads_its_clean_variant(tmp_path):
    """A module's SHARED_RUN: its CaseRun is the clean variant of the twins' run, one launch for both; the same
    run without it launches its own, the same bits."""
    variants = ("clean", "stale-weights")
    twins = VariantRuns(variants)
    one_step = CaseRun(CASE, shared=variants).run(
        _test_artifacts(tmp_path / "one_step")[0], variant_runs=twins
    )
    twin = twins.record(CASE, _test_artifacts(tmp_path / "twin")[0], "stale-weights")
    assert len(_launches(tmp_path)) == 1 and twin.entries != one_step.entries
    gates_for(CASE).check(one_step)

    alone = CaseRun(CASE).run(_test_artifacts(tmp_path / "alone")[0], variant_runs=twins)
    assert (
        len(_launches(tmp_path)) == 2
        and "--variants" not in (tmp_path / "alone" / "pytest-run.log").read_text()
    )
    assert alone.entries == one_step.entries  # the clean variant is the run a process of its own gives


def test_a_module_s_shared_run_is_one_launch_for_its_one_step_test_and_twins(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    pytester.makepyfile(
        test_model="""
        from rlsmoke.cases import Case
        from rlsmoke.suite import gates_for

        CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
        SHARED_RUN = ("clean", "stale-weights")

        def test_one_step(case_record):
            gates_for(CASE).check(case_record)

        def test_twin(rlsmoke_variant_runs, artifacts):
            assert rlsmoke_variant_runs.record(CASE, artifacts, "stale-weights").artifacts.endswith("stale-weights")
    """
    )
    root = tmp_path / "art"
    pytester.runpytest("-p", "no:cacheprovider", "--artifacts-dir", str(root)).assert_outcomes(passed=2)
    assert len(_launches(root)) == 1


def test_a_fault_twin_skips_on_a_launcher_without_faults(tmp_path):
    """Faults are injected into the built-in engine: under --launcher miles a twin is a skip with the reason."""
    import dataclasses

    from rlsmoke.artifacts import Artifacts
    from rlsmoke.cases import Case
    from rlsmoke.selection import DoesNotFit
    from rlsmoke.suite import VariantRuns

    case = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)
    runs = VariantRuns(("clean", "stale-weights"))
    art = dataclasses.replace(Artifacts(path=tmp_path), launcher="miles")
    with pytest.raises(DoesNotFit, match="not --launcher miles"):
        runs.record(case, art, "stale-weights")
