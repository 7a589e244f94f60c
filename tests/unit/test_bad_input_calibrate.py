"""`rlsmoke calibrate` on runs it cannot calibrate from: one `error:` line and exit 2, nothing written
(K3-K15 of the bad-input probe)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlsmoke.cli import main
from rlsmoke.errors import ExitCode

SUMMARY = {"case": "glm5-744b-a40b-4layer", "platform": "cpu", "device": "CPU", "launcher": "builtin",
           "width": "tiny", "dtype": {"rollout": "float32", "train": "float32"}}  # fmt: skip


def repeat_run(folder: Path, abs_diffs: list[float], summary=SUMMARY) -> Path:
    """A `rlsmoke run --repeat` folder: one step line per seed."""
    folder.mkdir()
    lines = [{"kind": "step", "index": 0, "repeat": seed,
              "metrics": {"train/train_rollout_logprob_abs_diff": value, "train/ppo_kl": 0.0}}
             for seed, value in enumerate(abs_diffs)]  # fmt: skip
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def refused(capsys, argv, rule: str) -> str:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == ExitCode.USAGE, (code, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1 and err.startswith(f"error: [{rule}] "), err
    assert ". Fix: " in err, err
    return err


def test_a_nan_metric_is_refused_never_written_as_a_bound(tmp_path, capsys):
    run = repeat_run(tmp_path / "r", [1e-6, float("nan")])
    target = tmp_path / "out.json"
    err = refused(capsys, ["calibrate", run, "--write", target], "calibrate.finite")
    assert "nan" in err and not target.exists()


def test_a_single_seed_is_refused_unless_asked(tmp_path, capsys):
    run = repeat_run(tmp_path / "r", [1e-6])
    err = refused(capsys, ["calibrate", run], "calibrate.seeds")
    assert "--min-seeds" in err
    assert main(["calibrate", str(run), "--min-seeds", "1"]) == ExitCode.OK
    refused(capsys, ["calibrate", run, "--min-seeds", "0"], "usage")


def test_a_cut_last_line_of_metrics_is_named(tmp_path, capsys):
    run = repeat_run(tmp_path / "r", [1e-6, 2e-6])
    jsonl = run / "metrics.jsonl"
    jsonl.write_bytes(jsonl.read_bytes()[:-40])
    err = refused(capsys, ["calibrate", run], "calibrate.metrics")
    assert "line 2" in err


def test_a_metrics_line_of_the_wrong_shape_is_named(tmp_path, capsys):
    run = repeat_run(tmp_path / "r", [1e-6, 2e-6])
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lines[0]["index"] = "first"
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    refused(capsys, ["calibrate", run], "calibrate.metrics")


@pytest.mark.parametrize("text", [
    '{"case": "glm5-744b',  # cut
    json.dumps([SUMMARY]),  # a list
    json.dumps({**SUMMARY, "num_gpus": "two"}),
    json.dumps({**SUMMARY, "case": 123, "platform": ["cpu"]}),
])  # fmt: skip
def test_a_bad_summary_is_one_line(tmp_path, capsys, text):
    run = repeat_run(tmp_path / "r", [1e-6, 2e-6])
    (run / "summary.json").write_text(text)
    refused(capsys, ["calibrate", run], "calibrate.summary")


def test_a_summary_without_a_device_takes_the_platforms(tmp_path, capsys):
    run = repeat_run(
        tmp_path / "r", [1e-6, 2e-6], summary={k: v for k, v in SUMMARY.items() if k != "device"}
    )
    target = tmp_path / "out.json"
    assert main(["calibrate", str(run), "--write", str(target)]) == ExitCode.OK, capsys.readouterr().err
    (entry,) = json.loads(target.read_text())["entries"]
    assert entry["provenance"]["device"] == "CPU"


def test_markdown_naming_a_folder_is_refused_before_write_writes(tmp_path, capsys):
    run = repeat_run(tmp_path / "r", [1e-6, 2e-6])
    (tmp_path / "mddir").mkdir()
    target = tmp_path / "out.json"
    refused(capsys, ["calibrate", run, "--write", target, "--markdown", tmp_path / "mddir"], "path.kind")
    assert not target.exists()


def test_write_on_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path):
    """A file-size limit stands in for a full disk: the write fails the same way (EFBIG, as ENOSPC)."""
    import resource

    run = repeat_run(tmp_path / "r", [1e-6, 2e-6])
    target_dir = tmp_path / "m"
    target_dir.mkdir()
    target = target_dir / "thr.json"
    proc = subprocess.run([sys.executable, "-m", "rlsmoke.cli", "calibrate", str(run), "--write", str(target)],
                          capture_output=True, text=True, timeout=120, env={**os.environ},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512)))  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert err.startswith("error: [disk.full] ") and "Traceback" not in err, err
    assert sorted(p.name for p in target_dir.iterdir()) == []
