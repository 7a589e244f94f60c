"""The checkpoint is this case's and is intact: another model's checkpoint and a flipped byte are exit 2
on every use (a --checkpoint, a cache hit), and the sha256 that finds the byte is paid once per file
version, not once per run.
"""

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from procs import run_cli

from rlsmoke.checkpoints import prepare
from rlsmoke.checkpoints.identity import check_checkpoint, check_checksums, check_identity
from rlsmoke.errors import CheckpointError, ExitCode
from rlsmoke.models import model_spec

GLM5, GLM45 = "glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer"


def copy_of(case: str, where: Path) -> Path:
    shutil.copytree(prepare(case, tiny=True), where)
    return where


def flip_a_byte(folder: Path) -> Path:
    """One byte of the first shard's tensor data, flipped in place; the mtime put back as it was."""
    shard = sorted(folder.glob("*.safetensors"))[0]
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.seek(st.st_size - 100)
        byte = f.read(1)
        f.seek(st.st_size - 100)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    return shard


def refused_run(case: str, ckpt: Path, out: Path) -> str:
    """`rlsmoke run` on `ckpt`, in this process (its refusal comes before anything loads)."""
    proc = run_cli([sys.executable, "-m", "rlsmoke.cli", "run", case, "--platform", "cpu", "--checkpoint", str(ckpt),
                    "--out", str(out)], env=os.environ, timeout=300)  # fmt: skip
    err = proc.stderr.strip()
    assert proc.returncode == ExitCode.USAGE, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("case, other", [(GLM5, GLM45), (GLM45, GLM5)])
def test_the_checkpoint_is_this_cases_and_is_intact_another_models_is_refused(tmp_path, case, other):
    err = refused_run(case, copy_of(other, tmp_path / "ckpt"), tmp_path / "out")
    assert (
        err.startswith("error: [checkpoint.identity]")
        and "model_type=" in err
        and f"rlsmoke prepare {case}" in err
    )


def test_the_checkpoint_is_this_cases_and_is_intact_a_flipped_byte_is_refused(tmp_path):
    ckpt = copy_of(GLM5, tmp_path / "ckpt")
    check_checkpoint(
        ckpt, model_spec(GLM5, tiny=True)
    )  # hashed once and stamped: the next use reads the stamp
    shard = flip_a_byte(ckpt)
    err = refused_run(GLM5, ckpt, tmp_path / "out")
    assert err.startswith("error: [checkpoint.verify]") and shard.name in err and "sha256 differs" in err, err


def test_the_checkpoint_is_this_cases_and_is_intact_a_flipped_byte_in_the_cache_is_not_used(tmp_path, capsys):
    cached = prepare(GLM45, tiny=True, cache_dir=tmp_path)
    manifest = (cached / "checksums.sha256").read_text()
    flip_a_byte(cached)
    assert prepare(GLM45, tiny=True, cache_dir=tmp_path) == cached
    said = capsys.readouterr().err
    assert "failed verification, rebuilding" in said and "sha256 differs" in said, said
    check_checksums(cached, cache_dir=tmp_path)  # rebuilt: every shard as its manifest says
    assert (cached / "checksums.sha256").read_text() == manifest  # the same bytes as before the flip


def test_a_cached_checkpoint_in_another_transformers_dtypes_is_rebuilt_not_reused(tmp_path, capsys):
    """transformers 5.24 keeps GLM-5's router gate in fp32; 5.12 wrote it in bf16, with the same names and
    shapes. A cache a 5.12 environment filled is rebuilt: the trainer's fp32 router must read fp32."""
    from safetensors.torch import load_file, save_file

    from rlsmoke.checkpoints.identity import sha256_file
    from rlsmoke.checkpoints.shards import write_manifest

    cached = prepare(GLM5, tiny=True, cache_dir=tmp_path)
    [shard] = cached.glob("*.safetensors")
    gate = "model.layers.3.mlp.gate.weight"
    tensors = load_file(shard)
    assert tensors[gate].dtype == torch.float32
    tensors[gate] = tensors[gate].to(torch.bfloat16)
    save_file(tensors, shard, metadata={"format": "pt"})
    write_manifest(cached, {shard.name: sha256_file(shard)})  # the checksums agree: only the dtype tells
    assert prepare(GLM5, tiny=True, cache_dir=tmp_path) == cached
    said = capsys.readouterr().err
    assert "failed verification, rebuilding" in said and "builds it in F32" in said, said
    assert load_file(shard)[gate].dtype == torch.float32


def test_a_checksum_is_paid_once_per_file_version(tmp_path):
    ckpt = copy_of(GLM45, tmp_path / "ckpt")
    shard_bytes = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    assert check_checksums(ckpt, cache_dir=tmp_path) == shard_bytes
    assert check_checksums(ckpt, cache_dir=tmp_path) == 0  # the stamp holds
    flip_a_byte(ckpt)  # same size, same mtime: the ctime moved
    with pytest.raises(CheckpointError, match="sha256 differs"):
        check_checksums(ckpt, cache_dir=tmp_path)
    with pytest.raises(CheckpointError, match="sha256 differs"):
        check_checksums(ckpt, cache_dir=tmp_path)  # and again: a failed file is never stamped


def test_a_prepared_checkpoint_is_stamped_as_it_is_verified_and_its_first_use_hashes_nothing(tmp_path):
    """The build's own verification hashed every shard: its first run reads the stamps (on an H200 host
    each model's first run hashed 11 GB for 11 s). The stamps are the files' versions: a byte flipped
    after the build is found all the same."""
    cached = prepare(GLM45, tiny=True, cache_dir=tmp_path)
    assert check_checksums(cached, cache_dir=tmp_path) == 0
    flip_a_byte(cached)
    with pytest.raises(CheckpointError, match="sha256 differs"):
        check_checksums(cached, cache_dir=tmp_path)


def test_a_file_that_changed_between_its_hash_and_the_rename_is_not_stamped(tmp_path):
    """Twin of the stamp a build leaves: only the versions that were hashed are stamped."""
    from rlsmoke.checkpoints.identity import file_versions, stamp_hashed

    ckpt = copy_of(GLM45, tmp_path / "ckpt")
    hashed = file_versions(ckpt)
    flip_a_byte(ckpt)  # after the hash: its ctime moved
    stamp_hashed(ckpt, hashed, cache_dir=tmp_path)
    with pytest.raises(CheckpointError, match="sha256 differs"):
        check_checksums(ckpt, cache_dir=tmp_path)  # stamped as it is now, it would have passed


def test_the_identity_check_names_the_width_when_only_it_differs(tmp_path):
    from rlsmoke.checkpoints.identity import differences

    ckpt = copy_of(GLM5, tmp_path / "ckpt")
    check_identity(ckpt, model_spec(GLM5, tiny=True))
    full = model_spec(GLM5, tiny=False)
    assert any(d.startswith("hidden_size=256") for d in differences({"model_type": "glm_moe_dsa", "hidden_size": 256},
                                                                    full))  # fmt: skip
    with pytest.raises(CheckpointError) as refused:
        check_identity(ckpt, full)
    line = refused.value.one_line()
    assert (
        line.startswith("[checkpoint.identity]")
        and "Fix: this is the case's tiny width: run with --tiny" in line
    )


class _NoLock:
    """The twin's lock: taken at once, whoever holds the real one."""

    def __init__(self, _path):
        pass

    def acquire(self):
        pass

    def release(self):
        pass


def _prepare_beside(conn, cache: Path, wait_for_the_lock: bool):
    import filelock

    if not wait_for_the_lock:
        filelock.FileLock = _NoLock
    built = []
    folder = prepare(GLM5, tiny=True, cache_dir=cache, say=built.append)
    conn.send((str(folder), bool(built)))
    conn.close()


@pytest.mark.parametrize("waits", [True, False], ids=["waits-for-the-builder", "twin-no-lock"])
def test_a_prepare_beside_one_building_the_same_checkpoint_waits_and_builds_nothing(tmp_path, waits):
    """What a job that prepares ahead while pytest starts relies on: a run's prepare finds the checkpoint
    being written, waits on the cache's lock, then reads what the other wrote. Twin: without the lock it
    builds its own copy meanwhile."""
    from filelock import FileLock
    from procs import InAChild

    from rlsmoke.checkpoints.cache import cache_key, cache_root, prepare_to
    from rlsmoke.engine.procs import rank_context

    root = cache_root(tmp_path)
    root.mkdir(parents=True)
    key = cache_key(GLM5, tiny=True, seed=0, dialect=None, fp8=False)
    with FileLock(str(root / f"{key}.lock")):  # the builder, as `rlsmoke prepare` holds it
        beside = InAChild(rank_context(cpu_only=True), _prepare_beside, tmp_path, waits)
        if waits:
            assert not beside.sent(2), "the prepare beside returned while the checkpoint was being built"
            prepare_to(root / key, GLM5, tiny=True, force=True, cache_dir=tmp_path)
        else:
            assert beside.sent(120)
    folder, built = beside.reply(120)
    assert folder == str(root / key)
    assert built is not waits
