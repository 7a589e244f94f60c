"""The pre-flight's parser runs in a process group of its own: a Miles whose import starts a child process and
hangs leaves nothing running after the timeout (M8 of the bad-input probe)."""

import os
import time

import pytest

from rlsmoke.cases import Case
from rlsmoke.errors import RlsmokeError
from rlsmoke.processes.preflight import check_flags

CASE = Case("glm5-744b-a40b-4layer", platform="nvidia", num_gpus=8)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_hanging_parsers_child_is_ended_with_it(tmp_path):
    pidfile = tmp_path / "child.pid"
    pkg = tmp_path / "miles" / "utils"
    pkg.mkdir(parents=True)
    (tmp_path / "miles" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "arguments.py").write_text(
        "import subprocess, time\n"
        "def parse_args():\n"
        "    child = subprocess.Popen(['sleep', '900'])\n"
        f"    open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(1e9)\n")  # fmt: skip
    with pytest.raises(RlsmokeError) as hung:  # the whole limit is waited out: short, with room to start
        check_flags(CASE.plan().launch, tmp_path, timeout=2)
    assert hung.value.rule == "miles.preflight" and "did not parse the argv in 2 s" in str(hung.value)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), f"the parser's child {child} is still running"


def test_a_parser_that_crashes_is_not_reported_as_a_refusal(tmp_path):
    """M7: `sys.exit(3)` in Miles' parse_args is the parser ending, not Miles refusing a flag."""
    pkg = tmp_path / "miles" / "utils"
    pkg.mkdir(parents=True)
    (tmp_path / "miles" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "arguments.py").write_text("import sys\ndef parse_args():\n    sys.exit(3)\n")
    with pytest.raises(RlsmokeError) as crashed:
        check_flags(CASE.plan().launch, tmp_path, timeout=30)
    assert crashed.value.rule == "miles.preflight" and "exit 3" in str(crashed.value)
