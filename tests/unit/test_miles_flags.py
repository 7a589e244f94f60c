"""Every golden launch against the flags its target's Miles accepts, as recorded from the real parser.

The tables (fixtures/miles_flags/TARGET.json) come from `python -m rlsmoke.conformance.record_flags`,
run where that Miles, its Megatron-LM and SGLang import; this check needs none of them.
"""

from pathlib import Path

import pytest
from flag_table import FlagTable, recorded_targets, refusals

from rlsmoke.targets import DEFAULT_TARGET, TARGETS

GOLDEN = Path(__file__).resolve().parents[2] / "fixtures" / "golden"
GOLDENS = sorted(GOLDEN.glob("*/*.txt"))
DONE_WHEN = {f"glm5-744b-a40b-4layer__{p}__{n}.txt" for p in ("nvidia", "rocm") for n in (2, 4, 8)} | {
    "glm5.3-flash__nvidia__32.txt", "glm4.5-355b-a32b__nvidia__64.txt"}  # fmt: skip


def args_of(golden: Path) -> list[str]:
    """The argv after `python3 SCRIPT` of a golden file (one token a line, after its env and node lines)."""
    lines = golden.read_text().splitlines()
    start = lines.index("python3")
    return lines[start + 2 :]


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_launch_has_only_flags_its_target_accepts(golden):
    table = FlagTable.of(golden.parent.name)
    assert refusals(args_of(golden), table) == []


def test_every_golden_target_has_a_table_and_the_default_covers_the_cases():
    assert {p.parent.name for p in GOLDENS} <= set(recorded_targets())
    assert DONE_WHEN <= {p.name for p in GOLDENS if p.parent.name == DEFAULT_TARGET}


@pytest.mark.parametrize("target", recorded_targets())
def test_table_names_its_commits_and_command(target):
    table = FlagTable.of(target)
    prov = table.provenance
    assert table.target == target and prov["miles"] == TARGETS[target].miles
    assert prov["megatron"] == TARGETS[target].megatron
    assert prov["command"].startswith("python -m rlsmoke.conformance.record_flags --target " + target)
    assert len(table.flags) > 1000  # Megatron's and Miles' flags and SGLang's under --sglang-


def test_a_removed_flag_is_refused():
    """The twin: Miles main removed --disable-weights-backuper (#2223); 0.0.2 still has it."""
    args = args_of(GOLDEN / DEFAULT_TARGET / "glm5-744b-a40b-4layer__nvidia__8.txt")
    found = refusals([*args, "--disable-weights-backuper"], FlagTable.of(DEFAULT_TARGET))
    assert len(found) == 1 and found[0].startswith("--disable-weights-backuper: not a flag of Miles")
    assert refusals(["--disable-weights-backuper"], FlagTable.of("miles-0.0.2")) == []
    assert refusals(["--rematerialize-param-from-master-weight"], FlagTable.of("miles-0.0.2")) != []


def test_a_bad_value_is_refused():
    table = FlagTable.of(DEFAULT_TARGET)
    found = refusals(["--sglang-kv-cache-dtype", "bf17", "--context-parallel-size", "one", "--colocate", "yes",
                      "--tensor-model-parallel-size"], table)  # fmt: skip
    assert [line.split(":")[0] for line in found] == ["--sglang-kv-cache-dtype", "--context-parallel-size",
                                                      "--colocate", "--tensor-model-parallel-size"]  # fmt: skip


def test_every_substitution_row_says_why():
    """A row that differs by platform or holds for some launchers only is a deliberate choice: it says why."""
    from rlsmoke.launch.substitutions import SUBSTITUTIONS

    for row in SUBSTITUTIONS:
        differs = row.nvidia != row.rocm or row.nvidia_env != row.rocm_env or row.launchers
        assert row.why or not differs, row.area


def test_the_table_check_agrees_with_argparse_on_the_parser_it_was_recorded_from():
    """record_flags' table of a real argparse parser: each argv is refused by the check iff argparse refuses it."""
    import argparse
    import enum

    from rlsmoke.conformance.record_flags import flag_table

    class Backend(enum.Enum):
        flash = 1
        fused = 2

    def build():
        p = argparse.ArgumentParser(allow_abbrev=False)
        p.error = lambda message: (_ for _ in ()).throw(ValueError(message))
        p.add_argument("--colocate", action="store_true")
        p.add_argument("--tp", type=int)
        p.add_argument("--lr", type=float)
        p.add_argument("--spec", nargs="*")
        p.add_argument("--backend", type=lambda s: Backend[s], choices=list(Backend))
        p.add_argument("--offload", action=argparse.BooleanOptionalAction)
        return p

    table = FlagTable("demo", {}, flag_table(build()))
    for argv in (["--colocate", "--tp", "2", "--spec", "a", "b", "--backend", "fused", "--no-offload", "--lr", "1e-6"],
                 ["--colocate", "yes"], ["--tp", "two"], ["--tp"], ["--backend", "slow"], ["--colo"],
                 ["--removed"], ["--lr", "x"]):  # fmt: skip
        try:
            build().parse_args(argv)
            accepted = True
        except (
            ValueError,
            KeyError,
        ):  # KeyError: an enum type's lookup, which argparse lets through (a crash)
            accepted = False
        assert (refusals(argv, table) == []) == accepted, argv
