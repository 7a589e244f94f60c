"""fla's kernel configs: the shipped folder for a GPU and fla version, fla's autotune elsewhere, and a
user's own FLA_CONFIG_DIR or FLA_CACHE_MODE always wins."""

import json

import pytest

from rlsmoke.engine import fla_configs


def shipped_for(tmp_path, gpu="NVIDIA_H200", fla="0.6.0"):
    folder = tmp_path / gpu
    folder.mkdir(parents=True)
    (folder / fla_configs.PROVENANCE).write_text(
        json.dumps({"gpu": "NVIDIA H200", "fla": fla, "date": "2026-12-04"})
    )
    return tmp_path


def test_fla_s_folder_name_for_a_gpu():
    assert fla_configs.gpu_folder("NVIDIA H200") == "NVIDIA_H200"
    assert fla_configs.gpu_folder("AMD Instinct MI300X (gfx942)") == "AMD_Instinct_MI300X_gfx942"


def test_the_gpu_tuned_for_gets_its_folder(tmp_path):
    folder, reason = fla_configs.select("NVIDIA H200", "0.6.0", shipped_for(tmp_path))
    assert folder == tmp_path / "NVIDIA_H200" and "fla 0.6.0" in reason


@pytest.mark.parametrize(("gpu", "fla", "why"), [("NVIDIA H100 80GB HBM3", "0.6.0", "no configs recorded for NVIDIA_H100_80GB_HBM3"),
                                                 ("NVIDIA H200", "0.7.0", "recorded with fla 0.6.0, this is fla 0.7.0")])  # fmt: skip
def test_another_gpu_or_fla_version_autotunes_and_says_why(tmp_path, gpu, fla, why):
    folder, reason = fla_configs.select(gpu, fla, shipped_for(tmp_path))
    assert folder is None and why in reason


def test_a_user_s_own_fla_settings_win(monkeypatch):
    monkeypatch.setenv("FLA_CACHE_MODE", "disabled")
    assert fla_configs.use("NVIDIA H200")["source"] == "user"


def test_no_shipped_configs_means_autotune_and_no_fla_settings(monkeypatch):
    for var in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE"):
        monkeypatch.delenv(var, raising=False)
    used = fla_configs.use("a GPU nobody tuned for")
    assert used["source"] == "autotune" and "no configs recorded" in used["reason"]
    import os

    assert "FLA_CONFIG_DIR" not in os.environ and "FLA_CACHE_MODE" not in os.environ


def test_every_shipped_folder_names_its_provenance():
    for folder in (
        (p for p in fla_configs.SHIPPED.iterdir() if p.is_dir()) if fla_configs.SHIPPED.is_dir() else ()
    ):
        recorded = json.loads((folder / fla_configs.PROVENANCE).read_text())
        assert {"gpu", "fla", "command", "date", "kernels"} <= set(recorded), folder
        assert recorded["kernels"] and all((folder / f"{k}.json").is_file() for k in recorded["kernels"])


def test_the_autotuner_walk_passes_over_dead_weak_proxies():
    """The record's walk over the collector's objects met a dead weak proxy after torch.compile had run
    (an H100 run's record raised ReferenceError at exit); such a proxy is passed over, live objects found."""
    import weakref

    class Tuned:
        pass

    gone = Tuned()
    proxy = weakref.proxy(gone)
    del gone
    with pytest.raises(ReferenceError):
        isinstance(proxy, Tuned)  # what a plain isinstance walk meets
    kept = Tuned()
    assert fla_configs.instances_of(Tuned) == [kept]
