"""Verify a checkpoint folder before anything loads it; every fault names the file and the tensor: index,
shard headers and lengths, config vs tensors, the sha256 manifest. All faults are collected."""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from rlsmoke.checkpoints.dialects import NATIVE_ARCH, dialect_problems
from rlsmoke.checkpoints.identity import sha256_file
from rlsmoke.checkpoints.shards import (
    DTYPE_SIZES,
    INDEX_NAME,
    MANIFEST_NAME,
    MAX_HEADER_BYTES,
    SINGLE_NAME,
    progress_bar,
    read_header,
)
from rlsmoke.errors import CheckpointError

BLOCK = 128  # FP8 weight block; a weight_scale_inv has ceil(shape / BLOCK)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class Fault:
    file: str
    tensor: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.tensor + ': ' if self.tensor else ''}{self.problem}"


@dataclass
class Report:
    folder: Path
    shards: list[str] = field(default_factory=list)
    tensors: int = 0
    nbytes: int = 0
    checksummed: bool = False
    faults: list[Fault] = field(default_factory=list)

    def add(self, file: str, tensor: str, problem: str) -> None:
        self.faults.append(Fault(file, tensor, problem))


class CheckpointFaults(CheckpointError):
    """verify found at least one fault; `faults` lists them all."""

    def __init__(self, folder: Path, faults: list[Fault]):
        self.faults = faults
        more = f" (+{len(faults) - 1} more)" if len(faults) > 1 else ""
        super().__init__(
            f"{folder}/{faults[0]}{more}",
            rule="checkpoint.verify",
            fix="re-create the checkpoint (rlsmoke prepare ... --force) or restore the named file",
        )


def verify(
    folder: Path | str,
    *,
    checksums: bool = True,
    config: bool = True,
    dialect: str | None = None,
    dtypes: bool = False,
    progress: bool = False,
) -> Report:
    """A Report, or CheckpointFaults naming every bad file and tensor; `dtypes`: this transformers' too."""
    folder = Path(folder)
    rep = Report(folder)
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder}: no such checkpoint folder", rule="checkpoint.verify", fix="check the path"
        )
    cfg = _read_json(folder, "config.json", rep)
    weight_map = _read_index(folder, rep)
    headers: dict[str, dict] = {}
    for shard in sorted(set(weight_map.values())):
        first = next(k for k, v in weight_map.items() if v == shard)
        if not _plain_name(shard):
            rep.add(INDEX_NAME, first, f"shard path {shard!r} is not a plain file name in the folder")
        elif not (folder / shard).is_file():
            rep.add(shard, first, "shard file is missing")
        elif (header := _check_shard(folder / shard, rep)) is not None:
            headers[shard] = header
            rep.shards.append(shard)
    _check_index_vs_shards(weight_map, headers, rep)
    if config and cfg is not None and not rep.faults:
        _check_config(cfg, headers, weight_map, rep, dtypes=dtypes)
    if dialect is not None and cfg is not None:
        for problem in dialect_problems(cfg, dialect):
            rep.add("config.json", "", problem)
    if checksums and (folder / MANIFEST_NAME).exists():
        _check_manifest(folder, rep, progress=progress)
    if rep.faults:
        raise CheckpointFaults(folder, rep.faults)
    return rep


def _read_json(folder: Path, name: str, rep: Report) -> dict | None:
    try:
        if isinstance(value := json.loads((folder / name).read_text()), dict):
            return value
        rep.add(name, "", f"is not a JSON object (a {type(value).__name__})")
    except FileNotFoundError:
        rep.add(name, "", "is missing")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        rep.add(name, "", f"is not valid JSON ({e})")
    return None


def _read_index(folder: Path, rep: Report) -> dict[str, str]:
    if (folder / INDEX_NAME).exists():
        index = _read_json(folder, INDEX_NAME, rep)
        wm = (index or {}).get("weight_map")
        if index is not None and not (isinstance(wm, dict) and all(isinstance(v, str) for v in wm.values())):
            rep.add(INDEX_NAME, "", "has no weight_map of {tensor: shard file}")
            return {}
        return wm or {}
    if (folder / SINGLE_NAME).exists():
        try:
            return {k: SINGLE_NAME for k in read_header(folder / SINGLE_NAME)}
        except Exception:  # the shard check below reports the header fault precisely
            return {"": SINGLE_NAME}
    rep.add(INDEX_NAME, "", f"is missing, and so is {SINGLE_NAME}")
    return {}


def _plain_name(name: str) -> bool:
    """A file of the folder itself: no separator (an absolute path has one), neither `.` nor `..`."""
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _check_shard(path: Path, rep: Report) -> dict | None:
    """Validate one shard's header and length; return {tensor: entry} or None if unreadable."""
    if (size := path.stat().st_size) < 8:
        rep.add(path.name, "", f"is {size} bytes, too short for a safetensors header")
        return None
    with open(path, "rb") as f:
        if (n := struct.unpack("<Q", f.read(8))[0]) > MAX_HEADER_BYTES or 8 + n > size:
            rep.add(path.name, "", f"header length {n} is corrupt or exceeds the file ({size} bytes)")
            return None
        raw = f.read(n)
    try:
        header = json.loads(raw)
        assert isinstance(header, dict)
    except (json.JSONDecodeError, UnicodeDecodeError, AssertionError):
        rep.add(path.name, "", "header is not valid safetensors JSON (corrupt header bytes)")
        return None
    header.pop("__metadata__", None)
    entries = {}
    for name, e in header.items():
        try:
            dtype, shape, (begin, end) = e["dtype"], e["shape"], e["data_offsets"]
            assert all(isinstance(d, int) and d >= 0 for d in shape) and 0 <= begin <= end
        except (KeyError, TypeError, ValueError, AssertionError):
            rep.add(path.name, name, f"malformed header entry {e!r}")
            continue
        if dtype not in DTYPE_SIZES:
            rep.add(path.name, name, f"unknown dtype {dtype!r}")
            continue
        want = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != want:
            rep.add(path.name, name, f"{dtype} x {shape} is {want} bytes but data_offsets span {end - begin}")
        entries[name] = (dtype, tuple(shape), begin, end)
    pos = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        if begin != pos:
            rep.add(path.name, name, f"data_offsets start at {begin}, expected {pos} (gap or overlap)")
        pos = end
    data = size - 8 - n
    if pos > data:
        cut = next(k for k, v in sorted(entries.items(), key=lambda kv: kv[1][2]) if v[3] > data)
        rep.add(path.name, cut, f"truncated: file has {data} data bytes, header needs {pos}")
    elif pos < data:
        rep.add(path.name, "", f"{data - pos} trailing bytes after the last tensor")
    rep.tensors += len(entries)
    rep.nbytes += size
    return entries


def _check_index_vs_shards(weight_map: dict[str, str], headers: dict[str, dict], rep: Report) -> None:
    for tensor, shard in weight_map.items():
        if shard in headers and tensor not in headers[shard]:
            rep.add(shard, tensor, f"listed in {INDEX_NAME} but not in this shard")
    for shard, entries in headers.items():
        for tensor in entries:
            if weight_map.get(tensor) != shard:
                where = f"mapped to {weight_map[tensor]}" if tensor in weight_map else "not listed"
                rep.add(shard, tensor, f"in this shard but {where} in {INDEX_NAME}")


def _check_config(
    cfg: dict, headers: dict[str, dict], weight_map: dict[str, str], rep: Report, *, dtypes: bool = False
) -> None:
    """Compare the tensors with what transformers builds from config.json."""
    from rlsmoke.checkpoints.synthesis import expected_layout

    try:
        layout = expected_layout(config_from_dict(cfg))
    except CheckpointError as e:
        rep.add("config.json", "", str(e))
        return
    except Exception as e:  # transformers rejected the config itself
        rep.add("config.json", "", f"transformers cannot build a model from it: {type(e).__name__}: {e}")
        return
    have = {t: headers[s][t] for t, s in weight_map.items() if s in headers and t in headers[s]}
    n_layers = (cfg.get("text_config") or cfg)["num_hidden_layers"]
    for name, (want_dtype, shape) in layout.tensors.items():
        if (got := have.get(name)) is None:
            rep.add("config.json", name, "expected by config.json but missing from every shard")
        elif got[1] != shape:
            rep.add(weight_map[name], name, f"shape {list(got[1])} but config.json implies {list(shape)}")
        elif dtypes and got[0] != want_dtype and f"{name}_scale_inv" not in have:  # FP8 has a scale
            rep.add(weight_map[name], name, f"{got[0]} but this transformers builds it in {want_dtype}")
    for name, (_, shape, _, _) in have.items():
        if name in layout.tensors:
            continue
        if name.endswith(".weight_scale_inv"):
            w = name[: -len("_scale_inv")]
            want = tuple(-(-d // BLOCK) for d in layout.tensors[w][1]) if w in layout.tensors else None
            if want is None or shape != want:
                rep.add(weight_map[name], name, f"FP8 scale of shape {list(shape)} does not fit weight {w}")
            continue
        if (m := _LAYER.search(name)) and int(m.group(1)) >= n_layers:
            continue  # an MTP layer: transformers ignores it, Miles and SGLang may use it
        rep.add(weight_map[name], name, "not expected by config.json (unexpected tensor)")


def config_from_dict(cfg: dict):
    """A transformers config from config.json's dict; the older Miles dialect is read as native GLM-5."""
    from transformers import AutoConfig

    d = {k: v for k, v in cfg.items() if k not in ("transformers_version", "auto_map", "quantization_config")}
    if d.get("model_type") == "deepseek_v32":
        d["model_type"], d["architectures"] = "glm_moe_dsa", [NATIVE_ARCH]
        d.pop("rope_theta", None)
    if (model_type := d.pop("model_type", None)) is None:
        raise CheckpointError(
            "config.json: has no model_type", rule="checkpoint.config", fix="add model_type"
        )
    return AutoConfig.for_model(model_type, **d)


def _check_manifest(folder: Path, rep: Report, *, progress: bool = False) -> None:
    lines = (folder / MANIFEST_NAME).read_text().splitlines()
    entries = [line.partition("  ")[::2] for line in lines if line.strip()]  # (digest, name)
    listed = [folder / name for _, name in entries if _plain_name(name) and (folder / name).is_file()]
    with progress_bar(sum(f.stat().st_size for f in listed), f"verify {folder.name}", progress) as bar:
        for digest, name in entries:
            if not _plain_name(name):
                rep.add(MANIFEST_NAME, "", f"names {name!r}, not a plain file name in the folder")
            elif not (folder / name).is_file():
                rep.add(name, "", f"listed in {MANIFEST_NAME} but missing")
            elif sha256_file(folder / name, on_bytes=bar) != digest:
                rep.add(name, "", f"sha256 differs from {MANIFEST_NAME}")
    rep.checksummed = True
