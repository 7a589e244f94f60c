"""`rlsmoke run --variants` loads once: each variant's records are those of a fresh `rlsmoke run` of its
fault and temperature at the same seed, bit for bit, at one rank and at 2 gloo ranks (FSDP2).

The orders would leak without the reset: a dropout variant, then one without (dropout left on); a
stale-weights variant, then a clean one (trained weights, a stale rollout copy); a temperature, then
another. The twins take the restore or the dropout's put-back away and see the next variant differ.
"""

import json
import os
import sys
from pathlib import Path

import pytest
from procs import run_cli

from rlsmoke.cases import Case
from rlsmoke.engine import megatron, train
from rlsmoke.engine.config import RunConfig, Variant, parse_variants
from rlsmoke.engine.placement import Colocated
from rlsmoke.engine.run import execute_variants
from rlsmoke.engine.train import set_dropout
from rlsmoke.errors import ExitCode
from rlsmoke.processes import here, runner
from rlsmoke.suite import builtin_argv

CASE = "glm5-744b-a40b-4layer"
SHAPE = {"n_prompts": 2, "n_samples": 2, "max_response_len": 6}
SHAPE_FLAGS = ("--n-prompts", "2", "--n-samples", "2", "--max-response-len", "6")
LAYOUTS = {
    "fsdp": (Case(CASE, platform="cpu", tiny=True), SHAPE_FLAGS,
             "train-dropout=0.1,clean@0.8,stale-weights,clean,temperature-mismatch@0.8"),
    "fsdp2-2-ranks-offload": (Case(CASE, platform="cpu", num_gpus=2, tiny=True), (*SHAPE_FLAGS, "--offload"),
                              "train-dropout=0.1,stale-weights,clean"),
    "megatron": (Case(CASE, platform="cpu", tiny=True), SHAPE_FLAGS, "stale-weights,temperature-mismatch@0.8"),
}  # fmt: skip
TRAINERS = {"megatron": "megatron"}  # the layouts not on the default trainer


def _lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class FreshRuns:
    """Each (layout, variant)'s own `rlsmoke run --inject ... --rollout-temperature ...`, run once per module
    when first read (forked from the fork server, as the suite runs megatron's)."""

    def __init__(self, root: Path):
        self.root, self.runs = root, {}

    def lines(self, layout: str, variant: Variant) -> list[dict]:
        if (layout, variant.slug) not in self.runs:
            self.runs[layout, variant.slug] = self._run(layout, variant)
        return _lines(self.runs[layout, variant.slug])

    def _run(self, layout: str, variant: Variant) -> Path:
        case, flags, _ = LAYOUTS[layout]
        out = self.root / layout / variant.slug
        argv = builtin_argv(case, out, inject=str(variant.inject) if variant.inject.kind else None,
                            rollout_temperature=variant.rollout_temperature,
                            trainer=TRAINERS.get(layout, "fsdp")) + list(flags)  # fmt: skip
        result = runner.run(
            argv,
            env=runner.clean_env(),
            log=out.parent / f"{out.name}.log",
            timeout=300,
            start=here.start_forked,
        )  # a process of its own: megatron's group stays there
        assert result.ok, result.log.read_text()[-3000:]
        return out


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    return FreshRuns(tmp_path_factory.mktemp("fresh"))


@pytest.mark.parametrize("layout", [
    pytest.param(name, marks=pytest.mark.skipif(name == "megatron" and not megatron.available(),
                                                reason="megatron-core is not installed"))
    for name in LAYOUTS])  # fmt: skip
def test_each_variant_is_a_fresh_run_of_its_fault(layout, fresh, tmp_path):
    case, flags, text = LAYOUTS[layout]
    variants = parse_variants(text, 1.0)
    out = tmp_path / "variants"
    argv = builtin_argv(case, out, trainer=TRAINERS.get(layout, "fsdp")) + [*flags, "--variants", text]
    result = runner.run(
        argv, env=runner.clean_env(), log=tmp_path / "variants.log", timeout=300, start=here.start_forked
    )
    assert result.ok, result.log.read_text()[-3000:]

    assert sorted(p.name for p in out.iterdir()) == sorted(v.slug for v in variants)
    for variant in variants:
        assert _lines(out / variant.slug) == fresh.lines(layout, variant), f"variant {variant} leaked"
        summary = json.loads((out / variant.slug / "summary.json").read_text())
        fresh_summary = json.loads((fresh.root / layout / variant.slug / "summary.json").read_text())
        assert summary["inject"] == fresh_summary["inject"] and summary["artifacts"] == str(
            out / variant.slug
        )
        assert (
            summary["rollout_temperature"]
            == variant.rollout_temperature
            == fresh_summary["rollout_temperature"]
        )
        timing = summary["timing"]
        assert timing["shared_load"] == {"runs": [v.slug for v in variants], "counted_in": variants[0].slug}
        first = variant == variants[0]
        assert (timing["load_s"] > 0) == first and len(timing["restore_s"]) == (0 if first else 1)
        assert (out / variant.slug / "run.log").read_text().count("rollout 0: ") == 1  # its own lines only


def _in_process(tmp_path: Path, text: str) -> dict[str, list[dict]]:
    """`execute_variants` in this process, where a test can take a piece of the reset away."""
    base = RunConfig(case=CASE, tiny=True, **SHAPE)
    variants = parse_variants(text, 1.0)
    execute_variants([(base.replace(inject=v.inject, rollout_temperature=v.rollout_temperature), tmp_path / v.slug)
                      for v in variants])  # fmt: skip
    return {v.slug: _lines(tmp_path / v.slug) for v in variants}


def _dropout_left_on(model, p):
    if p is not None:  # never put back: the next variant trains with the last one's dropout
        set_dropout(model, p)


LEAKS = {  # what is taken away, how, and the order that shows it
    "restore": (lambda mp: mp.setattr(Colocated, "restore_initial", lambda self: None), "stale-weights,clean"),
    "dropout-put-back": (lambda mp: mp.setattr(train, "set_dropout", _dropout_left_on), "train-dropout=0.1,clean"),
}  # fmt: skip


@pytest.mark.parametrize("leak", LEAKS)
def test_without_the_reset_the_next_variant_is_not_a_fresh_run(leak, fresh, tmp_path, monkeypatch):
    take_away, text = LEAKS[leak]
    clean = parse_variants("clean", 1.0)[0]
    assert _in_process(tmp_path / "whole", text)["clean"] == fresh.lines(
        "fsdp", clean
    )  # the same run, in here
    take_away(monkeypatch)
    assert _in_process(tmp_path / "leaky", text)["clean"] != fresh.lines("fsdp", clean)


def test_each_variant_is_gated_as_its_own_run(tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--variants", "clean,stale-weights",
            "--out", str(out)]  # fmt: skip
    proc = run_cli(argv, env=os.environ, timeout=300)
    assert proc.returncode == ExitCode.GATE_FAILED, proc.stderr[
        -3000:
    ]  # one variant failed: the command fails
    clean, stale = (
        json.loads((out / name / "summary.json").read_text()) for name in ("clean", "stale-weights")
    )
    assert clean["verdict"] == "PASS" and stale["verdict"] == "FAIL"
    assert "weight_sync" in {g["name"] for g in stale["gates"] if not g["passed"]}
    assert (out / "clean" / "run.log").read_text().splitlines()[-1] == "verdict: PASS"
    assert (out / "stale-weights" / "run.log").read_text().splitlines()[-1] == "verdict: FAIL"

    again = run_cli(argv, env=os.environ, timeout=300)  # --out's rules hold
    assert again.returncode == ExitCode.USAGE and "[run.out_used]" in again.stderr, again.stderr[-2000:]
    assert json.loads((out / "clean" / "summary.json").read_text()) == clean

    (out / "clean" / "run.log").write_text("an earlier run\n")
    replaced = run_cli([*argv, "--overwrite"], env=os.environ, timeout=300)
    assert replaced.returncode == ExitCode.GATE_FAILED, replaced.stderr[-3000:]
    assert "an earlier run" not in (out / "clean" / "run.log").read_text()
    summary = json.loads((out / "clean" / "summary.json").read_text())
    assert summary["artifacts"] == str(out / "clean") and summary["timing"]["shared_load"]["runs"] == [
        "clean",
        "stale-weights",
    ]  # named by their folders, not the staging ones they were written in
    assert sorted(p.name for p in out.iterdir()) == ["clean", "stale-weights"]  # no staging folder left


BAD = [  # (flags, the rule named)
    (("--variants", "clean,bogus"), "inject.known"),
    (("--variants", "clean,temperature-mismatch"), "run.config"),  # changes nothing at T=1
    (("--variants", "clean,train-dropout=1.5"), "inject.value"),
    (("--variants", "clean,stale-weights@200"), "run.range"),
    (("--variants", "clean,bridge-kv-order"), "run.variants"),
    (("--variants", "clean,clean@1"), "run.variants"),
    (("--variants", "clean,,stale-weights"), "run.variants"),
    (("--variants", "clean@warm"), "run.variants"),
    (("--variants", "clean", "--inject", "stale-weights"), "run.variants"),
    (("--variants", "clean,stale-weights", "--repeat", "2"), "run.variants_repeat"),
    (("--variants", "clean,stale-weights", "--mode", "async", "--num-gpus", "2"), "run.variants_async"),
    (("--variants", "clean,train-dropout=0.1", "--trainer", "megatron"), "run.config"),  # not wired there
]  # fmt: skip


@pytest.mark.parametrize(("flags", "rule"), BAD, ids=[f"{' '.join(f)}" for f, _ in BAD])
def test_a_bad_variant_is_one_error_line_before_anything_loads(flags, rule, tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", *flags, "--out", str(out)]
    proc = run_cli(argv, env=os.environ, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith(f"error: [{rule}]"), err
    assert "Fix:" in err and not out.exists()  # nothing written


def test_an_out_with_one_variant_s_earlier_records_is_refused_before_any_folder_is_made(tmp_path):
    out = tmp_path / "out"
    (out / "stale-weights").mkdir(parents=True)
    (out / "stale-weights" / "summary.json").write_text('{"verdict": "PASS"}\n')
    argv = [sys.executable, "-m", "rlsmoke.cli", "run", CASE, "--platform", "cpu", "--variants", "clean,stale-weights",
            "--out", str(out)]  # fmt: skip
    proc = run_cli(argv, env=os.environ, timeout=120)
    assert proc.returncode == ExitCode.USAGE and "[run.out_used]" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["stale-weights"]


def test_a_variant_s_folder_is_its_slug():
    assert [v.slug for v in parse_variants("clean,train-dropout=0.1,temperature-mismatch@0.8,rollout-noise=0.01@2",
                                           1.0)] == ["clean", "train-dropout-0.1", "temperature-mismatch-t0.8",
                                                     "rollout-noise-0.01-t2"]  # fmt: skip
    assert [str(v) for v in parse_variants("clean,stale-weights@0.7", 0.8)] == [
        "clean@0.8",
        "stale-weights@0.7",
    ]
