"""`SharedVariants`: the tests of one case's variants share one `rlsmoke run --variants` (one load), run
by the test that asks first while the others wait on its lock (two threads here, as two xdist workers
would), and each test keeps its own copy of its variant's records, gated as a run of its own.
"""

import json
import re
import threading

import pytest

from rlsmoke.artifacts import Artifacts
from rlsmoke.cases import Case
from rlsmoke.engine import megatron
from rlsmoke.errors import RlsmokeError
from rlsmoke.pytest_plugin import SHARED_RUNS_VAR
from rlsmoke.report import write_session_summary
from rlsmoke.selection import DoesNotFit
from rlsmoke.suite import GateFailure, SharedVariants, gates_for

pytest_plugins = ["pytester"]

CASE = Case("glm5-744b-a40b-4layer", platform="cpu", tiny=True)


def _test_artifacts(path, server, **kwargs) -> tuple[Artifacts, list]:
    """What the plugin's `artifacts` gives a test: its folder, its junit properties."""
    properties = []
    art = Artifacts(path, warm=server, record_property=lambda k, v: properties.append((k, v)), **kwargs)
    return art, properties


def _launches(shared) -> list[str]:
    return [line for log in shared.rglob("pytest-run.log") for line in log.read_text().splitlines()
            if line.startswith("$ ")]  # fmt: skip


def test_the_tests_of_one_case_share_one_run_and_each_gates_its_own(tmp_path, rlsmoke_run_server):
    shared = tmp_path / "shared"
    twins = SharedVariants(shared, ["clean", "stale-weights"])
    asked = {"clean": _test_artifacts(tmp_path / "test_clean", rlsmoke_run_server, history=tmp_path / "h.db"),
             "stale-weights": _test_artifacts(tmp_path / "test_stale", rlsmoke_run_server, history=tmp_path / "h.db")}
    records, failures = {}, []

    def ask(variant):
        try:
            records[variant] = twins.record(CASE, asked[variant][0], variant)
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            failures.append(exc)

    threads = [threading.Thread(target=ask, args=(v,)) for v in asked]  # both at once: one runs, one waits
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures

    assert len(_launches(shared)) == 1 and "--variants clean,stale-weights" in _launches(shared)[0]
    pids = set()
    for variant, (art, properties) in asked.items():
        summary = json.loads((art.path / "summary.json").read_text())
        assert summary["artifacts"] == str(art.path) and summary["inject"] == variant.replace("clean", "none")
        assert records[variant].ran_with.path == art.path and str(records[variant].artifacts) == str(art.path)
        assert ("artifacts", str(art.path)) in properties and any(k == "train/grad_norm" for k, _ in properties)
        pids |= set(re.findall(r"placement: colocate \{'train': \{'pid': (\d+)", (art.path / "run.log").read_text()))
    assert len(pids) == 1  # one process loaded once for both
    assert records["clean"].ran_with.history is not None and records["stale-weights"].ran_with.history is None

    gates_for(CASE).check(records["clean"])  # each gated as its own run
    assert json.loads((asked["clean"][0].path / "summary.json").read_text())["verdict"] == "PASS"
    with pytest.raises(GateFailure, match="weight_sync: sync/mismatched_params") as failure:
        gates_for(CASE).check(records["stale-weights"])
    assert f"artifacts: {asked['stale-weights'][0].path}" in str(failure.value)

    again = twins.record(CASE, _test_artifacts(tmp_path / "test_again", rlsmoke_run_server)[0], "clean")
    assert len(_launches(shared)) == 1 and again.entries == records["clean"].entries  # read, not run again


def test_a_shared_run_that_broke_fails_every_test_that_asks_without_running_again(tmp_path, rlsmoke_run_server):
    shared = tmp_path / "shared"
    twins = SharedVariants(shared, ["clean", "stale-weights"], flags=("--n-samples", "1"))  # refused: no group
    for variant in ("clean", "stale-weights"):
        art, _ = _test_artifacts(tmp_path / variant, rlsmoke_run_server)
        with pytest.raises(RlsmokeError, match=r"n_samples=1") as refused:
            twins.record(CASE, art, variant)
        assert refused.value.rule == "run.usage"
    assert len(_launches(shared)) == 1


@pytest.mark.skipif(not megatron.available(), reason="megatron-core is not installed")
def test_a_variant_the_trainer_cannot_run_skips_its_test_alone(tmp_path):
    twins = SharedVariants(tmp_path / "shared", ["clean", "train-dropout=0.1"])
    art = Artifacts(tmp_path / "t", trainer="megatron")
    with pytest.raises(DoesNotFit, match="train-dropout"):
        twins.record(CASE, art, "train-dropout=0.1")
    with pytest.raises(RlsmokeError, match="not one of") as undeclared:
        twins.record(CASE, art, "stale-weights")
    assert undeclared.value.rule == "suite.variants"
    assert not (tmp_path / "shared").exists()  # nothing ran


def test_a_bad_declaration_fails_where_it_is_declared(tmp_path):
    with pytest.raises(RlsmokeError, match="stale-weight") as bad:
        SharedVariants(tmp_path, ["clean", "stale-weight"])
    assert bad.value.rule == "inject.known"


def test_the_session_removes_its_shared_runs_and_its_summary_lists_only_the_tests_runs(pytester, monkeypatch,
                                                                                        tmp_path):  # fmt: skip
    monkeypatch.delenv(SHARED_RUNS_VAR, raising=False)  # this inner session starts first: it owns them
    monkeypatch.setenv("RLSMOKE_LEASE_DIR", str(tmp_path / "leases"))
    seen = tmp_path / "seen"
    pytester.makepyfile(test_shared=f"""
        import json

        def test_x(rlsmoke_shared_runs, artifacts):
            (rlsmoke_shared_runs / "case" / "clean").mkdir(parents=True)
            (rlsmoke_shared_runs / "case" / "clean" / "summary.json").write_text(json.dumps({{"case": "shared"}}))
            (artifacts.path / "summary.json").write_text(json.dumps({{"case": "own"}}))
            open({str(seen)!r}, "w").write(str(rlsmoke_shared_runs))
    """)  # fmt: skip
    root = tmp_path / "art"
    pytester.runpytest("-p", "no:cacheprovider", "--artifacts-dir", str(root)).assert_outcomes(passed=1)
    folder = seen.read_text()
    assert folder.startswith(str(root / ".shared-runs")) and not (root / ".shared-runs").exists()
    summary = (root / "summary.md").read_text()
    assert "| own |" in summary and "| shared |" not in summary


def test_the_session_summary_leaves_hidden_folders_out(tmp_path):
    for folder, case in (("t1", "a"), (".shared-runs/x/case/clean", "b"), (".t2.rlsmoke-new", "c")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "summary.json").write_text(json.dumps({"case": case}))
    rows = [line for line in write_session_summary(tmp_path).read_text().splitlines() if line.startswith("| [")]
    assert len(rows) == 1 and "| a |" in rows[0]


def test_a_one_step_test_that_declares_the_twins_run_reads_its_clean_variant(tmp_path, rlsmoke_run_server):
    """A module's SHARED_RUN: its CaseRun is the clean variant of the twins' run, one launch for both; the same
    run without it launches its own."""
    from rlsmoke.suite import CaseRun

    shared, variants = tmp_path / "shared", ("clean", "stale-weights")
    one_step = CaseRun(CASE, shared=variants).run(_test_artifacts(tmp_path / "one_step", rlsmoke_run_server)[0],
                                                  shared_runs=shared)  # fmt: skip
    twin = SharedVariants(shared, variants).record(CASE, _test_artifacts(tmp_path / "twin", rlsmoke_run_server)[0],
                                                   "stale-weights")  # fmt: skip
    assert len(_launches(shared)) == 1
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one_step", "twin")]
    assert [s["inject"] for s in summaries] == ["none", "stale-weights"] and twin.entries != one_step.entries
    gates_for(CASE).check(one_step)

    alone = CaseRun(CASE).run(_test_artifacts(tmp_path / "alone", rlsmoke_run_server)[0], shared_runs=shared)
    assert len(_launches(shared)) == 1 and "--variants" not in (tmp_path / "alone" / "pytest-run.log").read_text()
    assert alone.entries == one_step.entries  # the clean variant is the run a fresh process gives
