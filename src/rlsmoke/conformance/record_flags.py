"""Record what a Miles version's real argument parser accepts, as a flag table (data, not code).

    python -m rlsmoke.conformance.record_flags --target miles-2026-08-21 --out fixtures/miles_flags/miles-2026-08-21.json

Run where that Miles, its Megatron-LM and SGLang import. Miles' own `parse_args()` is stopped where the
parser would parse; every option's flag, nargs, type and choices are written. No GPU.
"""

from __future__ import annotations

import argparse
import datetime
import enum
import importlib.metadata
import json
import sys
from pathlib import Path
from unittest import mock

from rlsmoke.artifacts import write_atomic
from rlsmoke.conformance.device_facts import EmptyModuleFinder, stub_triton
from rlsmoke.processes.miles_parser_driver import miles_parser
from rlsmoke.targets import TARGETS

FORMAT = 1
# What Miles' first, Miles-only parser (`parse_args_train_backend`) requires before Megatron's is built.
MINIMAL_ARGV = ("--rollout-batch-size", "1")


def flag_table(parser: argparse.ArgumentParser) -> dict[str, dict]:
    flags: dict[str, dict] = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if not opt.startswith("--"):
                continue
            kind, choices = action.type, action.choices
            flags[opt] = {
                # 0 (a switch), an int, or argparse's '?', '*', '+'
                "nargs": 1 if action.nargs is None else action.nargs,
                "type": None if kind is None else getattr(kind, "__name__", type(kind).__name__),
                # sorted: some parsers build theirs from a set; an enum member as the command line spells it
                "choices": None
                if choices is None
                else sorted(c.name if isinstance(c, enum.Enum) else str(c) for c in choices),
            }
    return dict(sorted(flags.items()))


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class _Placeholder(type):
    """A class whose every attribute is another placeholder (`InterpolationMode.NEAREST_EXACT`)."""

    def __getattr__(cls, name: str):
        return _placeholder(name)


def _placeholder(name: str) -> type:
    if name.startswith("__"):  # what introspection asks for: absent, as on a real module
        raise AttributeError(name)
    return _Placeholder(name, (), {})


class _StandInFinder(EmptyModuleFinder):
    """Serves `root` and its submodules as modules whose every name is a placeholder class."""

    def create_module(self, spec):
        module = super().create_module(spec)
        module.__getattr__ = _placeholder  # `from torchvision.io import decode_jpeg`
        module.__version__ = "0.0.0"  # transformers compares it
        return module


def record(target: str, command: str) -> dict:
    # torchvision as a stand-in that SGLang's image imports find; triton as SGLang's stub if missing
    sys.meta_path.insert(0, _StandInFinder("torchvision"))
    stub_triton()
    with mock.patch.object(sys, "argv", sys.argv):  # Miles' full parser, as `parse_args()` builds it
        parser = miles_parser(list(MINIMAL_ARGV))
    t = TARGETS[target]
    return {
        "format": FORMAT,
        "provenance": {
            "target": target,
            "miles": t.miles,
            "megatron": t.megatron,
            "sglang": _version("sglang") or t.sglang,
            "miles_rl_wheel": _version("miles-rl"),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "python": sys.version.split()[0],
            "command": command,
            "recorded": datetime.date.today().isoformat(),
        },
        "parser": {"description": parser.description, "allow_abbrev": parser.allow_abbrev},
        "flags": flag_table(parser),
    }


def dumps(table: dict) -> str:
    """The table as JSON with one line per flag, so a new Miles version reads as a line diff."""
    head = json.dumps({k: v for k, v in table.items() if k != "flags"}, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(flag)}: {json.dumps(spec)}" for flag, spec in table["flags"].items())
    return f'{head},\n "flags": {{\n{rows}\n }}\n}}\n'


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rlsmoke.conformance.record_flags", description=__doc__.split("\n")[0]
    )
    p.add_argument("--target", required=True, choices=sorted(TARGETS))
    p.add_argument("--out", type=Path, required=True, help="the table to write (atomically)")
    p.add_argument("--miles-root", type=Path, help="a checkout of radixark/miles at the target's commit")
    p.add_argument(
        "--megatron-root", type=Path, help="a checkout of radixark/Megatron-LM at the target's commit"
    )
    args = p.parse_args(argv)
    t = TARGETS[args.target]
    for root in (args.megatron_root, args.miles_root):
        if root is not None:
            sys.path.insert(0, str(root.resolve()))
    # The command as it reads anywhere: the checkouts by repository and commit, not by local path.
    command = " ".join(["python -m rlsmoke.conformance.record_flags", "--target", args.target,
                        *(["--miles-root", f"<radixark/miles at {t.miles}>"] if args.miles_root else []),
                        *(["--megatron-root", f"<radixark/Megatron-LM at {t.megatron}>"] if args.megatron_root else []),
                        "--out", str(args.out)])  # fmt: skip
    table = record(args.target, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, dumps(table))
    print(f"{args.out}: {len(table['flags'])} flags of {args.target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
