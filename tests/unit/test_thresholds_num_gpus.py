"""Thresholds keyed by GPU count: a full-width 2-GPU key without an entry is a named error, and
`rlsmoke run --repeat` + `rlsmoke calibrate` produce the entry that then wins at that count."""

import json

import pytest

from rlsmoke import metrics
from rlsmoke.cli import main
from rlsmoke.errors import ExitCode, RlsmokeError
from rlsmoke.runkey import RunKey
from rlsmoke.thresholds import lookup_gates

FULL_H200 = {"platform": "nvidia", "device": "H200", "launcher": "builtin", "dtype": "bfloat16/float32",
             "width": "full"}  # fmt: skip


@pytest.mark.parametrize("case", ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer"])
def test_a_full_width_two_gpu_key_without_an_entry_names_itself(case):
    with pytest.raises(RlsmokeError) as err:
        lookup_gates(RunKey(case, num_gpus="2", **FULL_H200))
    assert err.value.rule == "thresholds.missing"
    assert f"case={case}" in str(err.value) and "num_gpus=2" in str(err.value)
    assert "rlsmoke calibrate" in err.value.fix


def test_entries_without_a_gpu_count_match_any_count():
    one = lookup_gates(RunKey("glm4.5-355b-a32b-4layer", num_gpus="1", **FULL_H200))
    assert lookup_gates(RunKey("glm4.5-355b-a32b-4layer", num_gpus="2", **FULL_H200)).source == one.source


@pytest.mark.slow
def test_repeat_then_calibrate_makes_the_two_rank_key(tmp_path, monkeypatch, capsys):
    """On CPU: a bf16 rollout at 2 ranks has no entry; its --repeat run calibrates one; that entry wins."""
    runs, target = tmp_path / "runs", tmp_path / "cluster" / "cal.json"
    rc = main(["run", "glm5-744b-a40b-4layer", "--platform", "cpu", "--num-gpus", "2", "--rollout-dtype", "bfloat16",
               "--repeat", "2", "--out", str(runs)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == ExitCode.USAGE and "[thresholds.missing]" in err and "num_gpus=2" in err, err
    assert json.loads((runs / "summary.json").read_text())["error"].startswith("[thresholds.missing]")

    assert main(["calibrate", str(runs), "--write", str(target)]) == ExitCode.OK
    (entry,) = json.loads(target.read_text())["entries"]
    assert entry["key"]["num_gpus"] == "2" and entry["provenance"]["runs"] == 2
    assert "--num-gpus 2 --repeat 2" in entry["provenance"]["command"]

    monkeypatch.setenv("RLSMOKE_THRESHOLDS_DIR", str(target.parent))
    gates = lookup_gates(RunKey.from_summary(metrics.seed_records(runs)[0].meta))
    assert gates.source == str(target) and gates.key.num_gpus == "2"
    with pytest.raises(RlsmokeError, match=r"thresholds\.missing|no thresholds"):
        lookup_gates(
            RunKey(
                "glm5-744b-a40b-4layer",
                platform="cpu",
                device="CPU",
                dtype="bfloat16/float32",
                width="tiny",
                num_gpus="1",
            )
        )
