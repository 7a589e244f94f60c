"""Parse one argv with the Miles on sys.path, as its `train.py` would, and stop there. Stdlib only.

    python -m rlsmoke.processes.miles_parser_driver ARGV_JSON RESULT_JSON

Run by `rlsmoke.processes.preflight`: takes Miles' own parser (`parse_args()`) at the moment it would parse
the command line; nothing after the parse runs. The result: {"accepted": bool, "message": argparse's error}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path


class _Stopped(Exception):
    """Raised where argparse would parse (with the parser) or exit on an error (with its message)."""


def miles_parser(args: list[str]) -> argparse.ArgumentParser:
    """The parser Miles' `parse_args()` builds for `args`, taken at its first `parse_args` call."""
    original = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise _Stopped(self)

    argparse.ArgumentParser.parse_args = stop
    sys.argv = ["train.py", *args]  # Miles reads sys.argv (its backend is picked from it first)
    try:
        from miles.utils.arguments import parse_args

        parse_args()
    except _Stopped as got:
        return got.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise RuntimeError("miles.utils.arguments.parse_args() returned without parsing the command line")


def _text(stream) -> str:
    stream.flush()
    stream.seek(0)
    return stream.read()


def parse(args: list[str]) -> dict:
    # a file with a descriptor: Megatron-LM's imports call faulthandler.enable(), which needs stderr's fileno
    stderr = tempfile.TemporaryFile("w+")
    try:
        with contextlib.redirect_stderr(stderr):
            parser = miles_parser(args)
    except SystemExit:  # Miles' first, Miles-only parser refused a value already (argparse printed why)
        errors = [line for line in _text(stderr).splitlines() if ": error: " in line]
        if not errors:  # not argparse's refusal: the parser itself ended (a crash, its own exit code)
            raise
        return {"accepted": False, "message": errors[-1].split(": error: ", 1)[1]}
    finally:
        sys.stderr.write(_text(stderr))

    def refuse(message: str):
        raise _Stopped(message)

    parser.error = refuse  # what would be `train.py: error: ...` and exit 2
    try:
        parser.parse_args(args)
    except _Stopped as refused:
        return {"accepted": False, "message": str(refused)}
    return {"accepted": True}


if __name__ == "__main__":
    args_path, result_path = map(Path, sys.argv[1:])
    result_path.write_text(json.dumps(parse(json.loads(args_path.read_text()))))
