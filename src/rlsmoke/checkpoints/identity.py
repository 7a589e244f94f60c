"""Whether a checkpoint folder is this case's and intact, cheaply enough to ask on every use. No torch.

checkpoint.identity: config.json against the case's spec (GLM-4.5's tiny widths equal GLM-5's). checkpoint
.verify: the sha256 manifest, with stamps under $RLSMOKE_CACHE/verified/ keyed by path, size, mtime,
ctime and inode, so a file is hashed again only once it changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from rlsmoke.checkpoints.cache_paths import cache_home
from rlsmoke.checkpoints.shards import MANIFEST_NAME
from rlsmoke.errors import CheckpointError
from rlsmoke.models import model_spec

# The config.json fields that tell one model (and width) from another.
IDENTITY_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "moe_intermediate_size",
                   "n_routed_experts", "num_attention_heads", "num_key_value_heads", "vocab_size")  # fmt: skip
MODEL_TYPE_ALIASES = {"deepseek_v32": "glm_moe_dsa"}
Version = tuple[int, int, int, int]  # a file's size, mtime, ctime and inode


def _config(folder: Path) -> dict:
    try:
        doc = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint={folder}: config.json cannot be read ({exc})", rule="checkpoint.verify",
                              fix="re-create the checkpoint (rlsmoke prepare ... --force)") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise CheckpointError(f"checkpoint={folder}: config.json is not an object", rule="checkpoint.verify",
                              fix="re-create the checkpoint (rlsmoke prepare ... --force)")  # fmt: skip
    return doc


def differences(doc: dict, spec) -> list[str]:
    """`field=checkpoint's (case: spec's)` for each identity field that differs."""
    found = []
    if MODEL_TYPE_ALIASES.get(doc.get("model_type"), doc.get("model_type")) != spec.hf_model_type:
        found.append(f"model_type={doc.get('model_type')!r} (case: {spec.hf_model_type!r})")
    text = doc.get("text_config") or doc
    want = spec.hf_text_kwargs()
    for name in IDENTITY_FIELDS:
        if name in text and name in want and text[name] != want[name]:
            found.append(f"{name}={text[name]} (case: {want[name]})")
    return found


def check_identity(folder: Path | str, spec) -> None:
    """Refuse a checkpoint whose config.json is not the case's model at the case's width."""
    folder = Path(folder)
    doc = _config(folder)
    if not (found := differences(doc, spec)):
        return
    other = model_spec(spec.name, tiny=spec.width != "tiny")
    if not differences(doc, other):
        fix = f"this is the case's {other.width} width: run with {'--tiny' if other.width == 'tiny' else '--no-tiny'}"
    else:
        fix = (f"pass a checkpoint of {spec.name} (`rlsmoke prepare {spec.name}{' --tiny' if spec.width == 'tiny' else ''} "
               f"--out DIR`), or leave --checkpoint out to use the prepared one")  # fmt: skip
    raise CheckpointError(f"checkpoint={folder} is not {spec.name}'s at the {spec.width} width: its config.json has "
                          + ", ".join(found), rule="checkpoint.identity", fix=fix)  # fmt: skip


# --- checksums, stamped ------------------------------------------------------------------------


def _stamp(path: Path, digest: str, cache_dir: Path | str | None) -> Path:
    st = path.stat()
    key = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0{digest}"
    return cache_home(cache_dir) / "verified" / hashlib.sha256(key.encode()).hexdigest()


def sha256_file(path: Path, chunk: int = 16 * 2**20, on_bytes=None) -> str:
    """The file's sha256, read `chunk` bytes at a time; `on_bytes(n)` hears each read (a progress bar)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while buf := f.read(chunk):
            h.update(buf)
            if on_bytes is not None:
                on_bytes(len(buf))
    return h.hexdigest()


def _manifest_files(folder: Path) -> list[tuple[str, str]]:
    """(digest, name) of each file the folder's manifest lists."""
    if not (manifest := folder / MANIFEST_NAME).is_file():
        return []
    entries = (line.partition("  ") for line in manifest.read_text().splitlines())
    return [(digest, name) for digest, _, name in entries if name]


def file_versions(folder: Path | str) -> dict[str, Version]:
    """Each manifest file's size, times and inode: what a stamp holds besides the path and the digest."""
    folder = Path(folder)
    versions = {}
    for _, name in _manifest_files(folder):
        with contextlib.suppress(OSError):
            st = (folder / name).stat()
            versions[name] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return versions


def stamp_hashed(
    folder: Path | str, hashed: Mapping[str, Version], *, cache_dir: Path | str | None = None
) -> None:
    """Stamp `hashed` under another path: a build renames its verified folder into place, inodes kept."""
    folder = Path(folder)
    now = file_versions(folder)
    for digest, name in _manifest_files(folder):
        if name in hashed and now.get(name) == hashed[name]:
            _write_stamp(_stamp(folder / name, digest, cache_dir), folder / name)


def _write_stamp(stamp: Path, path: Path) -> None:
    with contextlib.suppress(OSError):  # a stamp is a saving, never a requirement
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(f"{path}\n")


def check_checksums(folder: Path | str, *, cache_dir: Path | str | None = None) -> int:
    """The folder's sha256 manifest holds, from valid stamps or hashing; returns the bytes hashed now."""
    folder = Path(folder)
    hashed = 0
    fix = "re-create the checkpoint (rlsmoke prepare ... --force) or restore the named file"
    for digest, name in _manifest_files(folder):  # none listed: the headers and lengths are verify()'s
        path = folder / name
        if os.sep in name or name in (".", "..") or not path.is_file():
            raise CheckpointError(f"{folder}/{name}: listed in {MANIFEST_NAME} but missing", rule="checkpoint.verify",
                                  fix=fix)  # fmt: skip
        if (stamp := _stamp(path, digest, cache_dir)).is_file():
            continue
        hashed += path.stat().st_size
        if sha256_file(path) != digest:
            raise CheckpointError(f"{folder}/{name}: sha256 differs from {MANIFEST_NAME}", rule="checkpoint.verify",
                                  fix=fix)  # fmt: skip
        if _stamp(path, digest, cache_dir) == stamp:  # unchanged while it was read
            _write_stamp(stamp, path)
    return hashed


def check_checkpoint(folder: Path | str, spec) -> None:
    """The case's checkpoint, intact: its identity, then its checksums (stamped)."""
    check_identity(folder, spec)
    check_checksums(folder)
