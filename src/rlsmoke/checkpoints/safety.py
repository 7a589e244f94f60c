"""Atomic folder writes (a hidden sibling renamed into place), a disk-space preflight, the `--force` rule."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlsmoke.errors import CheckpointError
from rlsmoke.paths import check_dir

# Config, index, tokenizer and file-system slack on top of the tensor bytes.
HEADROOM_BYTES = 64 * 2**20
HEADROOM_FRACTION = 0.01


def disk_free(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    p = path.absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def preflight(out: Path, needed_bytes: int) -> None:
    """Refuse before writing anything when the disk cannot hold the result."""
    need = int(needed_bytes * (1 + HEADROOM_FRACTION)) + HEADROOM_BYTES
    if (free := disk_free(out)) < need:
        raise CheckpointError(
            f"{out}: needs {need / 1e9:.2f} GB but only {free / 1e9:.2f} GB are free on its disk",
            rule="checkpoint.disk",
            fix="free space, or pass --out on a larger disk (or set RLSMOKE_CACHE)",
        )


# What a build wrote, so `--force` can tell its checkpoint from a user's folder (older: the sha256 manifest).
OWNED_NAME = ".rlsmoke-checkpoint"
# What a synthesized checkpoint holds besides the shards its manifest lists.
BUILT_NAMES = frozenset({"config.json", "generation_config.json", "model.safetensors.index.json", "model.safetensors",
                         "checksums.sha256", "tokenizer.json", "tokenizer_config.json", OWNED_NAME})  # fmt: skip
_TMP = re.compile(r"\.tmp-(\d+)-(new|old|bf16)-[0-9a-f]{8}$")


def check_target(out: Path, force: bool) -> None:
    """`out` is absent, or `force` and it is empty or ours; a user's files are never deleted."""
    check_dir(out, "--out", must_exist=False, fix="pass --out a folder, or a path that does not exist yet")
    if not out.exists():
        return
    if not force:
        raise CheckpointError(
            f"{out}: exists and would be overwritten",
            rule="checkpoint.exists",
            fix="pass --force to replace it, or choose another --out",
        )
    if foreign := not_built_here(out):
        shown = ", ".join(foreign[:3]) + (f" (+{len(foreign) - 3} more)" if len(foreign) > 3 else "")
        raise CheckpointError(f"{out}: holds what rlsmoke did not write ({shown}), so --force does not replace it",
                              rule="checkpoint.not_ours",
                              fix="choose another --out (an empty or new folder), or remove the folder yourself "
                                  "if nothing in it is needed")  # fmt: skip


def not_built_here(folder: Path) -> list[str]:
    """The entries of `folder` no rlsmoke build wrote: not in OWNED_NAME (older builds: the manifest)."""
    from rlsmoke.checkpoints.identity import _manifest_files
    from rlsmoke.checkpoints.shards import MANIFEST_NAME

    entries = sorted(os.scandir(folder), key=lambda e: e.name)
    names = {e.name for e in entries}
    if OWNED_NAME in names:
        allowed = set((folder / OWNED_NAME).read_text(errors="replace").splitlines()) | {OWNED_NAME}
    elif MANIFEST_NAME in names:
        allowed = set(BUILT_NAMES) | {name for _, name in _manifest_files(folder)}
    else:
        allowed = set()
    return [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries
            if e.name not in allowed or not e.is_file(follow_symlinks=False)]  # fmt: skip


@contextlib.contextmanager
def atomic_dir(out: Path, needed_bytes: int, *, force: bool = False) -> Iterator[Path]:
    """A temporary folder next to `out` once its disk has room; renamed to `out` if the block succeeds."""
    preflight(out, needed_bytes)
    out = Path(out).absolute()
    check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        built = _TMP.search(stale.name)  # only a build's own leftovers, of a process that is gone
        if built and not _alive(int(built.group(1))):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = sibling(out, "new")
    tmp.mkdir()
    try:
        yield tmp
        names = sorted(e.name for e in os.scandir(tmp) if e.is_file(follow_symlinks=False))
        (tmp / OWNED_NAME).write_text("".join(f"{n}\n" for n in names if n != OWNED_NAME))
        _fsync_dir(tmp)
        if out.exists():
            # Rename first, delete after: there is always a complete folder at `out`.
            trash = sibling(out, "old")
            out.rename(trash)
            tmp.rename(out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            tmp.rename(out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sibling(out: Path, role: str) -> Path:
    """A hidden work folder next to `out` (rename is atomic), named after our pid (a crashed one shows)."""
    return out.parent / f".{out.name}.tmp-{os.getpid()}-{role}-{uuid.uuid4().hex[:8]}"


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # another user's
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
