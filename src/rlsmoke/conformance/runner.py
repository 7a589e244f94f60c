"""Run the real parsers on plans from the main venv, one subprocess per parser venv (`$RLSMOKE_*_PYTHON`,
else `$RLSMOKE_CONFORMANCE_VENVS/cvenv-*`); a missing interpreter gives a "not installed" verdict."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlsmoke.conformance.verdict import PARSERS, Verdict, applies

WORKER_TIMEOUT_S = 600
_SRC = Path(__file__).resolve().parents[2]  # the folder holding this rlsmoke package


def interpreter(parser: str) -> Path:
    explicit = os.environ.get(f"RLSMOKE_{parser.upper()}_PYTHON")
    if explicit:
        return Path(explicit)
    venvs = os.environ.get("RLSMOKE_CONFORMANCE_VENVS") or Path.home() / ".cache" / "rlsmoke" / "conformance"
    return Path(venvs) / f"cvenv-{parser}" / "bin" / "python"


def _not_run(parser: str, plans: list[dict], message: str) -> list[Verdict]:
    return [Verdict(parser, None, message, applies(parser, p)) for p in plans]


def run_parser(parser: str, plans: list[dict]) -> list[Verdict]:
    """The verdicts of one real parser on each plan, from a worker in that parser's venv."""
    python = interpreter(parser)
    if not os.access(python, os.X_OK):
        var = f"RLSMOKE_{parser.upper()}_PYTHON"
        return _not_run(
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
            return _not_run(parser, plans, f"harness error: worker ran past {WORKER_TIMEOUT_S} s")
        if proc.returncode != 0 or not out_file.exists():
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            return _not_run(parser, plans, f"harness error: worker exited {proc.returncode}: {tail}")
        result = json.loads(out_file.read_text())
    return [Verdict(**v) for v in result["verdicts"]]


def check_plans(plans: list[dict], parsers: tuple[str, ...] = tuple(PARSERS)) -> list[list[Verdict]]:
    """For each plan, the verdict of every parser (in `parsers` order). The parsers run in parallel."""
    with ThreadPoolExecutor(max_workers=len(parsers)) as pool:
        per_parser = list(pool.map(lambda p: run_parser(p, plans), parsers))
    return [[verdicts[i] for verdicts in per_parser] for i in range(len(plans))]
