"""`prepare`: the one call the engine makes. Builds and caches under $RLSMOKE_CACHE, keyed by (case, width,
seed, dialect, fp8), behind a file lock; a hit is verified (`checkpoints.identity`) or rebuilt."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rlsmoke.checkpoints.cache_paths import cache_home
from rlsmoke.checkpoints.dialects import check_dialect_name
from rlsmoke.errors import CheckpointError
from rlsmoke.models import model_spec
from rlsmoke.paths import from_os_error

FORMAT_VERSION = 2  # bump when synthesis changes a byte, so stale caches are not reused


def cache_root(cache_dir: Path | str | None = None) -> Path:
    return cache_home(cache_dir) / "checkpoints"


def cache_key(case: str, *, tiny: bool, seed: int, dialect: str | None, fp8: bool) -> str:
    width = "tiny" if tiny else "full"
    return f"{case}-{width}-seed{seed}-{dialect or 'native'}{'-fp8' if fp8 else ''}-v{FORMAT_VERSION}"


def cached_folder(
    case_name: str,
    *,
    tiny: bool,
    seed: int = 0,
    dialect: str | None = None,
    fp8: bool = False,
    cache_dir: Path | str | None = None,
) -> Path:
    """Where `prepare` keeps the checkpoint of these arguments (there or not)."""
    return cache_root(cache_dir) / cache_key(case_name, tiny=tiny, seed=seed, dialect=dialect, fp8=fp8)


def prepare(
    case_name: str,
    *,
    tiny: bool,
    seed: int = 0,
    dialect: str | None = None,
    fp8: bool = False,
    cache_dir: Path | str | None = None,
    progress: bool = False,
    say=None,
) -> Path:
    """A cached, verified synthesized checkpoint folder for the case. `say` hears what a build will write."""
    from filelock import FileLock

    from rlsmoke.checkpoints.identity import check_checksums
    from rlsmoke.checkpoints.verification import verify

    if dialect is not None:
        check_dialect_name(dialect, model_spec(case_name, tiny=tiny).hf_model_type)
    out = cached_folder(case_name, tiny=tiny, seed=seed, dialect=dialect, fp8=fp8, cache_dir=cache_dir)
    root, key = out.parent, out.name

    def intact(say_why: bool) -> bool:
        if not out.is_dir():
            return False
        try:
            verify(out, checksums=False, dtypes=True)
            check_checksums(out, cache_dir=cache_dir)  # hashed once, then a stamp that a write invalidates
            return True
        except CheckpointError as e:
            if say_why:
                print(f"rlsmoke: cached checkpoint failed verification, rebuilding: {e}", file=sys.stderr)
            return False

    if intact(say_why=False):  # read without the lock, which a read-only cache could not even open
        return out
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(root / f"{key}.lock"))
        lock.acquire()
    except OSError as exc:
        why = from_os_error(exc, "RLSMOKE_CACHE", cache_home())
        raise CheckpointError(f"{why} and holds no intact {key} to read (the cache's checkpoints: {root})", rule=why.rule,
                              fix="point RLSMOKE_CACHE at a folder you can write, or prepare the checkpoint into it "
                                  "first (`rlsmoke prepare CASE [--tiny]` with the cache writable)") from None  # fmt: skip
    try:
        if not intact(say_why=True):  # else another process built it meanwhile
            prepare_to(out, case_name, tiny=tiny, seed=seed, dialect=dialect, fp8=fp8, force=True, progress=progress,
                       say=say, cache_dir=cache_dir)  # fmt: skip
    finally:
        lock.release()
    return out


def prepare_to(
    out: Path | str,
    case_name: str,
    *,
    tiny: bool = False,
    seed: int = 0,
    dialect: str | None = None,
    fp8: bool = False,
    prune_from: Path | str | None = None,
    from_hub: str | None = None,
    keep_mtp: bool = False,
    dtype: str = "bf16",
    max_shard_bytes: int | None = None,
    force: bool = False,
    progress: bool = False,
    say=None,
    cache_dir: Path | str | None = None,
) -> Path:
    """Build one checkpoint into `out` atomically, verify it and stamp its checksums under `cache_dir`."""
    from rlsmoke.checkpoints import dialects, pruning, quantize, synthesis
    from rlsmoke.checkpoints.identity import file_versions, stamp_hashed
    from rlsmoke.checkpoints.safety import atomic_dir, check_target, sibling
    from rlsmoke.checkpoints.shards import DEFAULT_MAX_SHARD_BYTES, write_derived
    from rlsmoke.checkpoints.verification import verify

    out = Path(out).absolute()
    check_target(out, force)
    spec = model_spec(case_name, tiny=tiny)
    if dialect is not None:
        check_dialect_name(dialect, spec.hf_model_type)
    written: dict = {"max_shard_bytes": max_shard_bytes or DEFAULT_MAX_SHARD_BYTES, "progress": progress}
    if from_hub:
        prune_from = download(from_hub, out.parent)
    if prune_from:
        src = Path(prune_from)
        plans, cfg = pruning.pruned_plans(src, spec.first_k_dense, spec.num_moe_layers, keep_mtp)
        size = sum(p.nbytes for p in plans)
    else:
        size = synthesis.synth_bytes(spec, dtype)
    if say is not None:
        say(describe_write(spec, size, out, dtype=dtype, fp8=fp8, source=src if prune_from else None))
    with atomic_dir(out, size * (2 if fp8 else 1), force=force) as tmp:  # FP8: a bf16 stage next to `out`
        stage = sibling(out, "bf16") if fp8 else tmp
        stage.mkdir(exist_ok=True)
        try:
            if prune_from:
                write_derived(stage, src, plans, cfg, "prune", **written)
            else:
                synthesis.synthesize_into(stage, spec, dtype=dtype, seed=seed, **written)
            if fp8:
                quantize.fp8_into(tmp, stage, *quantize.fp8_plans(stage), **written)
        finally:
            if stage != tmp:
                shutil.rmtree(stage, ignore_errors=True)
        if dialect:
            dialects.patch(tmp, dialect)
        hashed = file_versions(tmp)
        verify(tmp)
    stamp_hashed(out, hashed, cache_dir=cache_dir)
    return out


def human_bytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def describe_write(
    spec, size: int, out: Path | str, *, dtype: str, fp8: bool, source: Path | None = None
) -> str:
    """The line `prepare` prints before it starts: what, how big, where (and the cheaper --tiny when full)."""
    what = f"pruned from {source}" if source else f"at the {spec.width} width"
    line = f"prepare: {spec.name} {what}, {dtype}: writes {human_bytes(size)} to {out}"
    if fp8:
        line += " (as a bf16 stage, then FP8)"
    if spec.width == "full" and not source:
        from rlsmoke.checkpoints.synthesis import synth_bytes

        line += f"; --tiny writes {human_bytes(synth_bytes(model_spec(spec.name, tiny=True), dtype))}"
    return line


def download(repo_id: str, parent: Path) -> Path:
    """Snapshot a hub repo for --from-hub; offline, fail with one clear line."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise CheckpointError(
            "--from-hub needs huggingface_hub", rule="prepare.hub", fix="pip install 'rlsmoke[hub]'"
        ) from e
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.py"]))
    except Exception as e:  # offline, unknown repo, gated: all end the same way for the user
        raise CheckpointError(
            f"--from-hub {repo_id}: cannot download ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
            rule="prepare.hub",
            fix="copy the checkpoint here and pass --prune-from DIR, or drop --from-hub to synthesize one",
        ) from e
