"""rlsmoke's topology validator against the real Miles, SGLang 0.5.23 and megatron-core validators.

Every row of conformance_table is rendered by rlsmoke (`Case(...).plan(validate=False)`, the plan
`rlsmoke plan ... --no-validate --format json` prints) and given to the real parser in this venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conformance_table import AGREE, NEW, PARSER_NAMES, STRICTER, Row, selected

from rlsmoke.cases import Case
from rlsmoke.conformance.verdict import applies
from rlsmoke.errors import TopologyError


def case_of(row: Row) -> Case:
    case = Case(row.case, platform=row.platform, num_gpus=row.num_gpus, mode=row.mode, target=row.target)
    return case.with_overrides(list(row.sets))


_PLANS: dict[str, dict] = {}


def render(row: Row) -> dict:
    """The plan `rlsmoke plan CASE ... --no-validate --format json` prints for the row."""
    if row.id not in _PLANS:
        _PLANS[row.id] = case_of(row).plan(validate=False).to_json()
    return _PLANS[row.id]


def rlsmoke_verdict(row: Row) -> tuple[bool, tuple[str, ...]]:
    """(valid, the rule ids that failed) from rlsmoke's own validator."""
    try:
        case_of(row).plan()
    except TopologyError as exc:
        return False, tuple(v[0] for v in exc.violations)
    return True, ()


def by_parser(rows, *, other_target: bool = False):
    """Parametrize over (row, parser) for the parsers that speak (or, for drift, not) the row's target.

    Only the parsers selected in this venv get params; the marker deselects the test where none is.
    """
    pairs = [
        (row, name) for row in rows for name in PARSER_NAMES if applies(name, render(row)) != other_target
    ]
    names = sorted({name for _, name in pairs})
    chosen = [pytest.param(row, name, id=f"{name}-{row.id}") for row, name in pairs if selected(name)]

    def decorate(fn):
        fn = pytest.mark.parametrize(("row", "parser"), chosen)(fn)
        return pytest.mark.conformance_parser(*names)(fn)

    return decorate


def test_the_table_is_big_enough():
    assert len(AGREE) >= 20
    assert {r.valid for r in AGREE} == {True, False}
    assert {r.target for r in AGREE} == {"miles-0.0.2", NEW}


@pytest.mark.parametrize("row", AGREE, ids=lambda r: r.id)
def test_rlsmoke_agrees_with_the_real_verdict(row):
    valid, rules = rlsmoke_verdict(row)
    assert valid == row.valid, (
        f"{row.id}: rlsmoke says {'valid' if valid else 'invalid ' + str(rules)}, the real parsers say "
        f"{'valid' if row.valid else 'invalid (' + ', '.join(row.rejected_by) + ')'}"
    )


@pytest.mark.parametrize("row", STRICTER, ids=lambda r: r.id)
def test_rlsmoke_is_stricter_on_purpose(row):
    valid, rules = rlsmoke_verdict(row)
    assert not valid and row.rule in rules, f"{row.id}: expected rlsmoke to reject by {row.rule}, got {rules}"


@by_parser(AGREE)
def test_real_parser_verdict(row, parser, load_parser):
    verdict = load_parser(parser).check(render(row))
    expected = row.rejected_by.get(parser)
    if expected is None:
        assert verdict.accepted, (
            f"{row.id}: {parser} rejected a plan the table says it accepts: {verdict.message}"
        )
    else:
        assert verdict.accepted is False, f"{row.id}: {parser} accepted a plan it should reject ({expected})"
        assert expected in verdict.message, (
            f"{row.id}: {parser} rejected it for another reason: {verdict.message}"
        )


@by_parser(STRICTER)
def test_real_parser_accepts_what_rlsmoke_is_stricter_on(row, parser, load_parser):
    verdict = load_parser(parser).check(render(row))
    assert verdict.accepted, f"{row.id}: {parser} now rejects it ({verdict.message}): move the row to AGREE"


DRIFT = tuple(r for r in AGREE if r.id.startswith(("seed004-review-rocm8", "glm5-rocm4")))


@by_parser(DRIFT, other_target=True)
def test_the_other_dialect_is_rejected(row, parser, load_parser):
    """Drift: Miles 0.0.2's bundled SGLang takes --nsa-*, SGLang 0.5.23 only --dsa-*; each refuses the other."""
    verdict = load_parser(parser).check(render(row))
    rendered = "dsa" if row.target == NEW else "nsa"
    flag = f"--sglang-{rendered}-prefill-backend" if parser == "miles" else f"--{rendered}-prefill-backend"
    assert verdict.accepted is False, f"{row.id}: {parser} accepted the other target's dialect"
    assert "unrecognized arguments" in verdict.message and flag in verdict.message, verdict.message


def test_each_target_renders_its_dialect():
    by_target = {
        row.target: render(row)["argv"] for row in DRIFT if row.id.startswith("seed004-review-rocm8")
    }
    bundled, new = by_target["miles-0.0.2"], by_target[NEW]
    for flag in ("--sglang-nsa-prefill-backend", "--sglang-nsa-decode-backend"):
        assert flag in bundled and flag.replace("nsa", "dsa") not in bundled
        assert flag.replace("nsa", "dsa") in new and flag not in new


@pytest.mark.conformance_parser("miles")
def test_hf_config_fixtures_are_fresh(load_parser):
    """The committed config.json files are what the generator writes with the Miles venv's transformers."""
    load_parser("miles")
    from rlsmoke.conformance.hf_fixtures import main

    assert main(["--check"]) == 0


CROSS_VENV = ("seed004-review-rocm8", "seed004-dp4", "seed004-review-rocm8-new", "seed004-dp4-new")


@pytest.mark.conformance_parser("runner")
def test_check_plan_from_the_main_venv():
    """`rlsmoke.conformance.check_plan` runs all three parsers in their venvs, without importing torch here."""
    rows = [r for r in AGREE if r.id in CROSS_VENV]
    script = (
        "import json, sys\n"
        "from rlsmoke.conformance import check_plans, real_verdict\n"
        "plans = json.load(sys.stdin)\n"
        "out = [[real_verdict(vs), [v.to_json() for v in vs]] for vs in check_plans(plans)]\n"
        "assert 'torch' not in sys.modules, 'check_plan imported torch'\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps([render(r) for r in rows]),
                          capture_output=True, text=True, timeout=900, env=os.environ.copy())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    for row, (real, verdicts) in zip(rows, results, strict=True):
        ran = [v for v in verdicts if v["applies"]]
        assert all(v["accepted"] is not None for v in ran), f"{row.id}: a parser did not run: {verdicts}"
        assert real == rlsmoke_verdict(row)[0] == row.valid, f"{row.id}: {verdicts}"
