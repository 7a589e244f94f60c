"""`rlsmoke run --help` and `rlsmoke plan --help` name the defaults the code uses: help text is formatted
from the constants, and this test reads every option's help against the parser's own default."""

import argparse
import re

import pytest

from rlsmoke import facts
from rlsmoke.cli import build_parser
from rlsmoke.recipe import BatchShape
from rlsmoke.targets import DEFAULT_TARGET, TARGETS


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


# What an option whose argparse default is None defaults to in the code (resolved after parsing).
RESOLVED = {
    "--target": DEFAULT_TARGET,
    "--gpus-per-node": str(facts.DEFAULT_GPUS_PER_NODE),
}


def wrong_defaults(parser: argparse.ArgumentParser) -> list[str]:
    """Each option whose help says `default X` (or `default: X`) where X is not the code's default."""
    wrong = []
    for action in parser._actions:
        flag = max(action.option_strings, key=len, default="")
        help_text = " ".join((action.help or "").replace("%%", "%").split())
        said = re.search(r"\(?default:? ([\w.-]+)", help_text)
        if not flag or not said:
            continue
        code = RESOLVED.get(flag, action.default)
        if (
            code is None
            or isinstance(code, bool)
            or said.group(1) in ("on", "off", "detected", "the", "a", "seed")
        ):
            continue  # a rule in words, not a value (the offload, the platform)
        if said.group(1) != str(code):
            wrong.append(f"{flag}: help says {said.group(1)}, the code uses {code}")
    return wrong


@pytest.mark.parametrize("command", ["run", "plan"])
def test_help_names_the_defaults_the_code_uses(command):
    parser = _subparser(command)
    assert wrong_defaults(parser) == []
    text = " ".join(parser.format_help().split())
    assert f"(default {DEFAULT_TARGET})" in text
    assert not [t for t in TARGETS if t != DEFAULT_TARGET and f"default {t}" in text]
    assert facts.in_words(facts.DEFAULT_MODE) in text


def test_run_help_names_the_batch_and_the_resident_rule():
    text = " ".join(_subparser("run").format_help().split())
    cpu, gpu = BatchShape.for_platform("cpu"), BatchShape.for_platform("nvidia")
    assert f"on CPU: {cpu.n_samples})" in text and f"seed 004's {gpu.n_samples};" in text
    assert f"{facts.RESIDENT_FRACTION:.0%} of it" in text
    assert facts.faults_text().replace(" ", "") in text.replace(" ", "")


def test_a_drifted_default_is_found():
    """The twin: a help that names an old target, or a default the parser does not have, is caught."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default=None, help="versions (default miles-0.0.2)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 1)")
    parser.add_argument("--reward", default="target", help="reward (default target)")
    assert wrong_defaults(parser) == ["--target: help says miles-0.0.2, the code uses miles-2026-08-21",
                                      "--seed: help says 1, the code uses 0"]  # fmt: skip
