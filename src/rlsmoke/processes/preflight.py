"""Before Ray starts: the user's own Miles parses the rendered argv, so a flag it refuses is an error in
seconds, not after a cluster started and a job was submitted (`miles_parser_driver`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rlsmoke.errors import RlsmokeError
from rlsmoke.paths import check_dir

TIMEOUT_S = 180.0  # an import of Miles, Megatron and SGLang; a parse takes well under a second


def check_flags(launch, miles_root: Path, *, timeout: float = TIMEOUT_S) -> None:
    """`[miles.flags]` when Miles refuses `launch.argv`; `[miles.preflight]` when its parser cannot run."""
    miles_root = check_dir(
        miles_root, "--check-miles", fix="pass --check-miles the folder of a Miles checkout"
    ).resolve()
    target = launch.target or "?"
    # As the job has it (cwd first, then the plan's PYTHONPATH), then this rlsmoke for the driver itself.
    path = [str(miles_root), *launch.env.get("PYTHONPATH", "").split(os.pathsep),
            *os.environ.get("PYTHONPATH", "").split(os.pathsep), str(Path(__file__).resolve().parents[2])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in path if p))}
    with tempfile.TemporaryDirectory(prefix="rlsmoke-preflight-") as tmp:
        args_file, result_file = Path(tmp) / "argv.json", Path(tmp) / "result.json"
        args_file.write_text(json.dumps(launch.argv[2:]))
        cmd = [sys.executable, "-m", "rlsmoke.processes.miles_parser_driver"]
        cmd += [str(args_file), str(result_file)]
        try:
            proc = _parse_in_own_group(cmd, miles_root, env, timeout)
        except subprocess.TimeoutExpired:
            raise RlsmokeError(f"the Miles at {miles_root} did not parse the argv in {timeout:.0f} s",
                               rule="miles.preflight", fix="check that its imports work on this Python") from None  # fmt: skip
        if proc.returncode != 0 or not result_file.exists():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or f"exit {proc.returncode}"
            raise RlsmokeError(f"the Miles at {miles_root} could not parse on {sys.executable}: {tail}",
                               rule="miles.preflight",
                               fix="run rlsmoke with the Python that runs that Miles (its venv), with its "
                                   "Megatron-LM on PYTHONPATH")  # fmt: skip
        result = json.loads(result_file.read_text())
    if not result["accepted"]:
        # the flags argparse's message names: every one after `unrecognized arguments:`, else the first
        before, unrecognized, named = result["message"].partition("unrecognized arguments:")
        flags = (
            [t for t in named.split() if t.startswith("-")]
            if unrecognized
            else re.findall(r"--[\w-]+", before)[:1]
        )
        which = " ".join(flags) if flags else "the argv"
        raise RlsmokeError(
            f"the Miles at {miles_root} refuses {which}, rendered for target {target}: {result['message']}",
            rule="miles.flags",
            fix=f"use a Miles at {target}'s commit{_commit(target)}, or render for the target that matches "
            "yours (`rlsmoke plan CASE --target T --check-miles DIR`; `--diff T` shows what changes)",
        )


def _parse_in_own_group(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """The parser in a process group of its own, which ends with it however the wait ends."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            proc.communicate()  # reaped, its pipes closed
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _commit(target: str) -> str:
    from rlsmoke.targets import TARGETS

    if (t := TARGETS.get(target)) is None:
        return ""
    megatron = "its bundled Megatron-LM" if t.megatron == "bundled" else f"Megatron-LM {t.megatron}"
    return f" (Miles {t.miles}, {megatron})"
