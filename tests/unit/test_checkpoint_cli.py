"""`prepare` and `verify` through register() and a plain argparse, as the main CLI will call them."""

import argparse
import json
import re

from rlsmoke.checkpoints.cache import cache_key, prepare
from rlsmoke.checkpoints.cli import parse_size, register
from rlsmoke.errors import ExitCode, RlsmokeError


def run(*argv) -> tuple[int, str]:
    """What the main CLI does: parse, call the handler, turn RlsmokeError into one line and exit 2."""
    parser = argparse.ArgumentParser(prog="rlsmoke")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args), ""
    except RlsmokeError as e:
        return ExitCode.USAGE, f"error: {e.one_line()}"


def test_prepare_then_verify(tmp_path, capsys):
    out = tmp_path / "ck"
    rc, _ = run("prepare", "glm5-744b-a40b-4layer", "--tiny", "--out", str(out), "--dialect", "deepseek_v32",
                "--max-shard-size", "2MB", "--no-progress")  # fmt: skip
    assert rc == 0 and capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "deepseek_v32"
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert run("verify", str(out)) == (0, "")
    assert " ok, " in capsys.readouterr().out
    rc, err = run("verify", str(out), "--dialect", "glm_moe_dsa")
    assert rc == 2 and "config.json" in err and "\n" not in err
    rc, err = run("prepare", "glm5-744b-a40b-4layer", "--tiny", "--out", str(out))
    assert rc == 2 and "exists" in err and "--force" in err


def test_prune_from_and_fp8(tmp_path):
    src = tmp_path / "src"
    assert run("prepare", "glm4.5-355b-a32b-4layer", "--tiny", "--out", str(src), "--no-progress")[0] == 0
    out = tmp_path / "out"
    rc, err = run("prepare", "glm4.5-355b-a32b-4layer", "--tiny", "--out", str(out), "--prune-from", str(src),
                  "--fp8", "--no-progress")  # fmt: skip
    assert rc == 0, err
    assert "quantization_config" in json.loads((out / "config.json").read_text())
    assert not list(tmp_path.glob(".*"))  # no stage or temp folders left behind


def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    broken.mkdir()
    rc, err = run("verify", str(broken))
    assert rc == 2 and "config.json" in err
    rc, err = run("prepare", "glm4.5-355b-a32b-4layer", "--tiny", "--dialect", "deepseek_v32")
    assert rc == 2 and "glm4_moe" in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, err = run(
        "prepare",
        "glm5-744b-a40b-4layer",
        "--out",
        str(tmp_path / "h"),
        "--from-hub",
        "Pinaster/GLM-5_4layer",
    )
    assert rc == 2 and "--from-hub Pinaster/GLM-5_4layer: cannot download" in err and "\n" not in err
    rc, err = run("prepare", "no-such-case", "--tiny")
    assert rc == 2 and err.startswith("error: [case.known] case='no-such-case' is unknown")


def test_cache_prepares_once(tmp_path):
    a = prepare("glm4.5-355b-a32b-4layer", tiny=True, seed=3, cache_dir=tmp_path)
    stamp = (a / "model.safetensors.index.json").stat().st_mtime_ns
    b = prepare("glm4.5-355b-a32b-4layer", tiny=True, seed=3, cache_dir=tmp_path)
    assert a == b and (b / "model.safetensors.index.json").stat().st_mtime_ns == stamp
    assert a.name == cache_key("glm4.5-355b-a32b-4layer", tiny=True, seed=3, dialect=None, fp8=False)
    (a / "model.safetensors.index.json").write_text("{}")  # a corrupt cache entry is rebuilt
    assert prepare("glm4.5-355b-a32b-4layer", tiny=True, seed=3, cache_dir=tmp_path) == a
    assert json.loads((a / "model.safetensors.index.json").read_text())["weight_map"]


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("512MiB") == 2**29 and parse_size("1000") == 1000


def _folder_bytes(folder) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_prepare_says_what_it_will_write_before_it_starts(tmp_path, capsys):
    out = tmp_path / "ck"
    assert run("prepare", "glm5-744b-a40b-4layer", "--tiny", "--out", str(out), "--no-progress")[0] == 0
    first = capsys.readouterr().err.splitlines()[0]
    m = re.match(
        r"prepare: glm5-744b-a40b-4layer at the tiny width, bf16: writes ([\d.]+) (MB|GB) to ", first
    )
    assert m, first
    said = float(m.group(1)) * (1e6 if m.group(2) == "MB" else 1e9)
    assert abs(said - _folder_bytes(out)) / _folder_bytes(out) < 0.05, (said, _folder_bytes(out))


def test_the_full_width_announcement_names_its_gigabytes_and_the_tiny_flag():
    # the line `prepare_to` says, at the size it would synthesize (26 GB: not written here)
    from rlsmoke.checkpoints.cache import describe_write
    from rlsmoke.checkpoints.synthesis import synth_bytes
    from rlsmoke.models import model_spec

    spec = model_spec("glm5-744b-a40b-4layer")
    text = describe_write(spec, synth_bytes(spec, "bf16"), "ckpt", dtype="bf16", fp8=False)
    assert re.search(r"full width, bf16: writes 2[56]\.\d GB to ckpt", text) and "--tiny" in text, text


def test_verify_shows_a_progress_bar(tmp_path, capsys):
    out = tmp_path / "ck"
    assert run("prepare", "glm4.5-355b-a32b-4layer", "--tiny", "--out", str(out), "--no-progress")[0] == 0
    capsys.readouterr()
    assert run("verify", str(out))[0] == 0
    err = capsys.readouterr().err
    assert "verify" in err and "100%" in err, err
    assert run("verify", str(out), "--no-progress")[0] == 0
    assert capsys.readouterr().err == ""


def test_readme_prepares_the_tiny_width_on_a_laptop():
    """The README's CPU example must not write a 26 GB full-width checkpoint without saying so."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = [line for line in readme.splitlines() if line.startswith("rlsmoke prepare")]
    assert lines and all("--tiny" in line or " GB" in line for line in lines), lines
