"""Atomic folder writes, a disk-space preflight, and the `--force` rule.

A checkpoint folder appears complete or not at all: everything is written into a hidden sibling
folder on the same file system, then renamed into place. A crash leaves only the temporary folder,
which the next run removes; it never leaves a half-written checkpoint that looks like a real one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlsmoke.errors import CheckpointError

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
    free = disk_free(out)
    if free < need:
        raise CheckpointError(
            f"{out}: needs {need / 1e9:.2f} GB but only {free / 1e9:.2f} GB are free on its disk",
            rule="checkpoint.disk",
            fix="free space, or pass --out on a larger disk (or set RLSMOKE_CACHE)",
        )


def check_target(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise CheckpointError(
            f"{out}: exists and would be overwritten",
            rule="checkpoint.exists",
            fix="pass --force to replace it, or choose another --out",
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a folder", rule="checkpoint.exists", fix="remove it")


@contextlib.contextmanager
def atomic_dir(out: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to `out`; rename it to `out` only if the block succeeds."""
    out = Path(out).absolute()
    check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        if not _owner_alive(stale):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = sibling(out, "new")
    tmp.mkdir()
    try:
        yield tmp
        _fsync_dir(tmp)
        if out.exists():
            # Rename first, delete after: there is never a moment without a complete folder at `out`
            # that is not also a moment with the new one fully written.
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
    """A hidden work folder next to `out` (same file system, so rename is atomic), named after our pid
    so that a later run can tell a crashed writer's leftovers from a live writer's."""
    return out.parent / f".{out.name}.tmp-{os.getpid()}-{role}-{uuid.uuid4().hex[:8]}"


def _owner_alive(tmp: Path) -> bool:
    try:
        pid = int(tmp.name.split(".tmp-")[1].split("-")[0])
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
