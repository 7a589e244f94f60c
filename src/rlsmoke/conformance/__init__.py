"""Conformance: the real Miles, SGLang and megatron-core validators on a rendered plan, each in its own
venv; the plan is valid when every parser of its target's dialect accepts it. No torch here.

From the main venv each parser runs as one worker subprocess in its venv (`$RLSMOKE_*_PYTHON`, else
`$RLSMOKE_CONFORMANCE_VENVS/cvenv-*`); a missing interpreter gives a "not installed" verdict."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlsmoke.conformance.verdict import PARSERS, Verdict, not_run

__all__ = ["Verdict", "check_plan", "check_plans", "format_verdicts", "real_verdict"]

WORKER_TIMEOUT_S = 600
_SRC = Path(__file__).resolve().parents[2]  # the folder holding this rlsmoke package


def interpreter(parser: str) -> Path:
    if explicit := os.environ.get(f"RLSMOKE_{parser.upper()}_PYTHON"):
        return Path(explicit)
    venvs = os.environ.get("RLSMOKE_CONFORMANCE_VENVS") or Path.home() / ".cache" / "rlsmoke" / "conformance"
    return Path(venvs) / f"cvenv-{parser}" / "bin" / "python"


def run_parser(parser: str, plans: list[dict]) -> list[Verdict]:
    """The verdicts of one real parser on each plan, from a worker in that parser's venv."""
    python = interpreter(parser)
    if not os.access(python, os.X_OK):
        var = f"RLSMOKE_{parser.upper()}_PYTHON"
        return not_run(
            parser, plans, f"not installed: no {python} (set {var}, or run .ci/conformance-envs.sh)"
        )
    with tempfile.TemporaryDirectory(prefix=f"rlsmoke-{parser}-") as tmp:
        plans_file, out_file = Path(tmp) / "plans.json", Path(tmp) / "verdicts.json"
        plans_file.write_text(json.dumps(plans))
        # The worker imports the same rlsmoke as this process, whatever its venv has installed.
        search = os.pathsep.join(filter(None, [str(_SRC), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": search}
        cmd = [str(python), "-m", "rlsmoke.conformance.worker", parser]
        cmd += ["--plans", str(plans_file), "--out", str(out_file)]
        try:
            proc = subprocess.run(
                cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return not_run(parser, plans, f"harness error: worker ran past {WORKER_TIMEOUT_S} s")
        if proc.returncode != 0 or not out_file.exists():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            return not_run(parser, plans, f"harness error: worker exited {proc.returncode}: {tail}")
        return [Verdict(**v) for v in json.loads(out_file.read_text())["verdicts"]]


def check_plans(plans: list[dict]) -> list[list[Verdict]]:
    """For each plan, the verdict of every parser (in `PARSERS` order). The parsers run in parallel."""
    with ThreadPoolExecutor(max_workers=len(PARSERS)) as pool:
        per_parser = list(pool.map(lambda p: run_parser(p, plans), PARSERS))
    return [[verdicts[i] for verdicts in per_parser] for i in range(len(plans))]


def check_plan(plan_json: dict) -> list[Verdict]:
    """The verdict of each real parser (Miles 0.0.2, SGLang 0.5.23, megatron-core 0.16.1) on one plan."""
    return check_plans([plan_json])[0]


def real_verdict(verdicts: list[Verdict]) -> bool | None:
    """True/False from the parsers that apply to the plan's target; None if one of them did not run."""
    relevant = [v for v in verdicts if v.applies]
    return None if any(v.accepted is None for v in relevant) else all(v.accepted for v in relevant)


def format_verdicts(verdicts: list[Verdict]) -> str:
    """The `--check` report: one line per parser, then the overall verdict."""
    summary = {True: "accepted by every real parser of the target",
               False: "REJECTED by a real parser of the target",
               None: "incomplete: a parser of the target did not run"}[real_verdict(verdicts)]  # fmt: skip
    return "\n".join([*(v.one_line() for v in verdicts), f"overall  {summary}"])
