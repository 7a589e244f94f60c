"""Safetensors shards read and written by hand, so a 2 GB embedding goes to disk 32 MB at a time (the
`safetensors` library wants every tensor of a file in memory)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import shutil
import struct
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from rlsmoke.facts import SYNTHESIS_THREADS

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MANIFEST_NAME = "checksums.sha256"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # HF's "5GB"
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own limit

DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZES = {k: v.itemsize for k, v in DTYPES.items()}


CHUNK_BYTES = 32 * 2**20  # the unit of generation, copying and writing


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write; `chunk(i)` by index, so workers can make the next ones while one is written."""

    name: str
    dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    chunk: Callable[[int], bytes | memoryview]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]

    @property
    def n_chunks(self) -> int:
        return -(-self.nbytes // CHUNK_BYTES)


def split_into_shards(plans: list[TensorPlan], max_shard_bytes: int) -> list[list[TensorPlan]]:
    """Greedy, in order: a new shard starts when the next tensor would overflow this one."""
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for p in plans:
        if shards[-1] and size + p.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def encode_header(plans: list[TensorPlan]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    pos = 0
    for p in plans:
        header[p.name] = {"dtype": p.dtype, "shape": list(p.shape), "data_offsets": [pos, pos + p.nbytes]}
        pos += p.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as the library writes it
    return struct.pack("<Q", len(raw)) + raw


def write_shards(
    out: Path,
    plans: list[TensorPlan],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Callable[[int], None] | None = None,
    manifest: bool = True,
    workers: int | None = None,
) -> None:
    """Write `plans` as HF shards plus the index into `out`."""
    groups = split_into_shards(plans, max_shard_bytes)
    tasks = [(p, i) for group in groups for p in group for i in range(p.n_chunks)]
    chunks = _prefetch(tasks, workers or max(1, min(SYNTHESIS_THREADS, os.cpu_count() or 1)))
    weight_map: dict[str, str] = {}
    digests: dict[str, str] = {}
    for n, group in enumerate(groups):
        fname = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        digests[fname] = _write_one(out / fname, group, chunks, progress)
        weight_map.update({p.name: fname for p in group})
    total = sum(p.nbytes for p in plans)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    if manifest:
        write_manifest(out, digests)


def _prefetch(tasks: list[tuple[TensorPlan, int]], workers: int) -> Iterator[bytes | memoryview]:
    """Chunks in order, made by `workers` threads a few chunks ahead (torch and file reads drop the GIL)."""
    if workers <= 1:
        yield from (p.chunk(i) for p, i in tasks)
        return
    it = iter(tasks)
    with ThreadPoolExecutor(workers) as pool:
        # 2 * workers ahead: bounds memory to a few chunks
        pending = deque(pool.submit(p.chunk, i) for p, i in itertools.islice(it, 2 * workers))
        while pending:
            chunk = pending.popleft().result()
            for p, i in itertools.islice(it, 1):
                pending.append(pool.submit(p.chunk, i))
            yield chunk


def _write_one(
    path: Path, plans: list[TensorPlan], chunks: Iterator, progress: Callable[[int], None] | None
) -> str:
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        head = encode_header(plans)
        f.write(head)
        sha.update(head)
        for p in plans:
            written = 0
            for _ in range(p.n_chunks):
                chunk = next(chunks)
                f.write(chunk)
                sha.update(chunk)
                n = memoryview(chunk).nbytes
                written += n
                if progress:
                    progress(n)
            assert written == p.nbytes, f"{p.name}: wrote {written} bytes, planned {p.nbytes}"
        f.flush()
        os.fsync(f.fileno())
    return sha.hexdigest()


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A tqdm byte counter's `update` when asked for, else None: a progress callback of the writers."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    class Bar(tqdm):
        monitor_interval = 0  # no monitor thread: it would outlive the bar and turn rank forks off

    with Bar(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024) as bar:
        yield bar.update


def write_manifest(out: Path, digests: dict[str, str]) -> None:
    (out / MANIFEST_NAME).write_text("".join(f"{d}  {name}\n" for name, d in sorted(digests.items())))


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """Raw little-endian bytes of a contiguous CPU tensor, without a copy."""
    return memoryview(t.contiguous().view(torch.uint8).reshape(-1).numpy())


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def read_header(path: Path) -> dict[str, Entry]:
    """Parse a shard header without validating it (verify does that); raises on unreadable bytes."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(min(n, MAX_HEADER_BYTES)))
    base = 8 + n
    return {
        k: Entry(k, v["dtype"], tuple(v["shape"]), base + v["data_offsets"][0], base + v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__"
    }


def read_chunk(path: Path, entry: Entry, i: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(entry.begin + i * CHUNK_BYTES)
        want = min(CHUNK_BYTES, entry.nbytes - i * CHUNK_BYTES)
        buf = f.read(want)
    if len(buf) != want:
        raise EOFError(f"{path.name}: tensor {entry.name} ends early")
    return buf


def read_tensor(path: Path, entry: Entry) -> torch.Tensor:
    with open(path, "rb") as f:
        f.seek(entry.begin)
        buf = bytearray(f.read(entry.nbytes))
    t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
    return t.view(DTYPES[entry.dtype]).reshape(entry.shape)


def load_index(ckpt: Path) -> dict[str, str]:
    """{tensor: shard file} of a folder, sharded or single-file."""
    if (idx := ckpt / INDEX_NAME).exists():
        return json.loads(idx.read_text())["weight_map"]
    return {k: SINGLE_NAME for k in read_header(ckpt / SINGLE_NAME)}


def tensors_in_order(folder: Path) -> Iterator[tuple[Path, str, Entry]]:
    """(shard, name, entry) of every tensor of a checkpoint, shard by shard in file order."""
    for shard in sorted(set(load_index(folder).values())):
        for name, entry in sorted(read_header(folder / shard).items(), key=lambda kv: kv[1].begin):
            yield folder / shard, name, entry


def write_derived(folder: Path, src: Path, plans: list[TensorPlan], cfg: dict, desc: str, *,
                  max_shard_bytes: int, progress: bool, workers: int | None = None) -> None:  # fmt: skip
    """A checkpoint from `src` into an empty `folder`: its other files copied, `cfg`, `plans` as shards."""
    rewritten = ("config.json", INDEX_NAME, MANIFEST_NAME)
    for f in src.iterdir():
        if f.is_file() and f.name not in rewritten and f.suffix != ".safetensors":
            shutil.copyfile(f, folder / f.name)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    with progress_bar(sum(p.nbytes for p in plans), desc, progress) as bar:
        write_shards(folder, plans, max_shard_bytes=max_shard_bytes, progress=bar, workers=workers)
