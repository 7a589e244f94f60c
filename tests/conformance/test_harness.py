"""The harness's own logic, with no real parser: runs in every venv, the main one included."""

from __future__ import annotations

import pytest

from rlsmoke.conformance import Verdict, check_plan, format_verdicts, real_verdict
from rlsmoke.conformance.sglang_parser import engine_argv
from rlsmoke.conformance.verdict import applies, describe_exception
from rlsmoke.engine.megatron.flags import flag_value

PLAN = {
    "case": "glm5-744b-a40b-4layer",
    "argv": ["python3", "train_async.py", "--hidden-size", "6144", "--rollout-num-gpus-per-engine", "2",
             "--sglang-mem-fraction-static", "0.70", "--sglang-enable-dp-attention", "--sglang-dp-size", "2",
             "--sglang-router-port", "3000", "--sglang-server-concurrency", "8", "--sglang-page-size", "64",
             "--hf-checkpoint", "/nowhere/GLM-5"],
    "env": {},
    "topology": {"case": "glm5-744b-a40b-4layer", "platform": "rocm", "target": "miles-0.0.2",
                 "target_versions": {"miles": "0.0.2", "sglang": "bundled"}},
}  # fmt: skip


def test_engine_argv_follows_miles_prefix_rule():
    argv = engine_argv(PLAN)
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert argv[argv.index("--model-path") + 1].endswith("fixtures/hf_configs/glm5-744b-a40b-4layer")
    tail = argv[argv.index("--tp-size") + 2 :]
    assert tail == [
        "--mem-fraction-static",
        "0.70",
        "--enable-dp-attention",
        "--dp-size",
        "2",
        "--page-size",
        "64",
    ]


def test_target_decides_which_parser_applies():
    assert applies("miles", PLAN) and not applies("sglang", PLAN) and applies("mcore", PLAN)
    new = {**PLAN, "topology": {**PLAN["topology"], "target_versions": {"miles": "main", "sglang": "0.5.23"}}}
    assert not applies("miles", new) and applies("sglang", new)


def test_real_verdict_ignores_the_other_dialect():
    verdicts = [
        Verdict("miles", True, "ok"),
        Verdict("sglang", False, "unrecognized arguments: --nsa-prefill-backend", applies=False),
        Verdict("mcore", True, "ok"),
    ]
    assert real_verdict(verdicts) is True
    assert real_verdict([*verdicts[:2], Verdict("mcore", False, "heads")]) is False
    assert real_verdict([*verdicts[:2], Verdict("mcore", None, "not installed")]) is None
    assert "overall  accepted" in format_verdicts(verdicts)


def test_missing_interpreter_reports_not_installed(monkeypatch):
    for name in ("MILES", "SGLANG", "MCORE"):
        monkeypatch.setenv(f"RLSMOKE_{name}_PYTHON", "/nonexistent/python")
    verdicts = check_plan(PLAN)
    assert [v.parser for v in verdicts] == ["miles", "sglang", "mcore"]
    assert all(v.accepted is None and v.message.startswith("not installed") for v in verdicts)


def test_bare_assert_names_the_source_line(tmp_path, monkeypatch):
    (tmp_path / "real_code.py").write_text("def check(tp, dp):\n    assert tp % dp == 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from real_code import check  # a module pytest does not rewrite, like the real parsers

    with pytest.raises(AssertionError) as info:
        check(2, 4)
    assert describe_exception(info.value).endswith("real_code.py:2: `assert tp % dp == 0`")


def test_flag_value_takes_the_last():
    assert flag_value(["--a", "1", "--a=2"], "--a") == "2"
    assert flag_value(["--a"], "--a") is None
