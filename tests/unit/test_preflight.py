"""The pre-flight: the user's Miles parses the rendered argv (a real subprocess, its own parser) before Ray starts."""

import os

import pytest
from fake_miles import write_fake_miles

from rlsmoke.cases import Case
from rlsmoke.cli import main
from rlsmoke.errors import RlsmokeError
from rlsmoke.processes.preflight import check_flags

CASE = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=8)


def test_a_miles_that_accepts_the_launch_passes(tmp_path):
    check_flags(CASE.plan().launch, write_fake_miles(tmp_path))


def test_a_miles_without_a_rendered_flag_is_refused_naming_flag_and_target(tmp_path):
    """The twin: a Miles whose parser lacks the rematerialize flag, as Miles before #2223 did."""
    miles = write_fake_miles(tmp_path, refuse=("--rematerialize-param-from-master-weight",))
    with pytest.raises(RlsmokeError) as refused:
        check_flags(CASE.plan().launch, miles)
    assert refused.value.rule == "miles.flags"
    message = refused.value.one_line()
    assert "refuses --rematerialize-param-from-master-weight, rendered for target miles-2026-08-21" in message
    assert "unrecognized arguments" in message


def test_a_miles_that_cannot_import_is_its_own_error(tmp_path):
    with pytest.raises(RlsmokeError) as broken:
        check_flags(CASE.plan().launch, tmp_path)  # no miles package here
    assert broken.value.rule == "miles.preflight" and "ModuleNotFoundError" in str(broken.value)


def test_plan_check_miles_is_one_error_line_and_exit_2(tmp_path, capsys):
    args = ["plan", "glm5-744b-a40b-4layer", "--platform", "nvidia", "--num-gpus", "8", "--check-miles"]
    ok = write_fake_miles(tmp_path / "ok")
    assert main([*args, str(ok)]) == 0
    assert "--rematerialize-param-from-master-weight" in capsys.readouterr().out
    old = write_fake_miles(tmp_path / "old", refuse=("--sglang-kv-cache-dtype",))
    assert main([*args, str(old)]) == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert (
        len(err) == 1 and err[0].startswith("error: [miles.flags] ") and "--sglang-kv-cache-dtype" in err[0]
    )
    assert out == ""  # no launch printed that its Miles refuses


def test_a_miles_whose_import_enables_faulthandler_passes(tmp_path):
    """Megatron-LM's inference coordinator calls faulthandler.enable() as Miles imports it: the driver's
    captured stderr must have a file descriptor (found on the H200, where a StringIO failed the pre-flight)."""
    miles = write_fake_miles(tmp_path)
    (miles / "miles" / "__init__.py").write_text("import faulthandler\n\nfaulthandler.enable()\n")
    check_flags(CASE.plan().launch, miles)


def test_a_stringio_capture_fails_that_miles_import(tmp_path, monkeypatch):
    """Its twin: the driver's capture made a StringIO again (a sitecustomize in the driver's process), and
    the same Miles fails the pre-flight on faulthandler's missing fileno."""
    miles = write_fake_miles(tmp_path / "miles-root")
    (miles / "miles" / "__init__.py").write_text("import faulthandler\n\nfaulthandler.enable()\n")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import io, tempfile\n\ntempfile.TemporaryFile = lambda *a, **k: io.StringIO()\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    with pytest.raises(RlsmokeError) as broken:
        check_flags(CASE.plan().launch, miles)
    assert broken.value.rule == "miles.preflight" and "fileno" in str(broken.value)
