"""A Miles checkout small enough to write in a test: its `parse_args()` is argparse's, strict like Miles'.

Its parser defines every `--flag` of the command line it is given except those in `refuse`, so it
accepts any rendered launch unless told which flag this Miles lacks.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

ARGUMENTS = textwrap.dedent("""
    import argparse
    import sys

    REFUSE = {refuse!r}


    def parse_args():
        parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
        for token in sys.argv[1:]:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in REFUSE and flag not in parser._option_string_actions:
                parser.add_argument(flag, nargs="*")
        return parser.parse_args()
""")


def write_fake_miles(root: Path, *, refuse: tuple[str, ...] = (), train: str = "") -> Path:
    """`root/miles/utils/arguments.py` (and `root/train.py` when given): a Miles whose parser lacks `refuse`."""
    pkg = root / "miles" / "utils"
    pkg.mkdir(parents=True, exist_ok=True)
    (root / "miles" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "arguments.py").write_text(ARGUMENTS.format(refuse=set(refuse)))
    if train:
        (root / "train.py").write_text(train)
    return root
