"""Entry point inside a conformance venv: check a batch of plans with one real parser.

python -m rlsmoke.conformance.worker miles|sglang|mcore --plans IN.json --out OUT.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

from rlsmoke.conformance.verdict import PARSERS, Verdict, applies, not_run

MODULES = {
    "miles": "rlsmoke.conformance.miles_parser",
    "sglang": "rlsmoke.conformance.sglang_parser",
    "mcore": "rlsmoke.conformance.mcore",
}


def load(parser: str):
    """The harness module with its real parser imported; raises ImportError when it is not installed."""
    module = importlib.import_module(MODULES[parser])
    module.load()
    return module


def check_all(parser: str, plans: list[dict]) -> list[Verdict]:
    try:
        module = load(parser)
    except ImportError as exc:
        return not_run(parser, plans, f"not installed: {PARSERS[parser]} cannot be imported here ({exc})")
    verdicts = []
    for plan in plans:
        try:
            verdicts.append(module.check(plan))
        except Exception as exc:  # the harness itself broke (e.g. no config.json): not a verdict
            message = f"harness error: {type(exc).__name__}: {exc}"
            traceback.print_exc()
            verdicts.append(Verdict(parser, None, message, applies(parser, plan)))
    return verdicts


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("parser", choices=sorted(MODULES))
    cli.add_argument("--plans", required=True, help="JSON file: a list of rendered plans")
    cli.add_argument("--out", required=True, help="JSON file to write the verdicts to")
    args = cli.parse_args(argv)
    verdicts = check_all(args.parser, json.loads(Path(args.plans).read_text()))
    Path(args.out).write_text(json.dumps({"verdicts": [v.to_json() for v in verdicts]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
