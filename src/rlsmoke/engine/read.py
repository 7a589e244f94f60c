"""A checkpoint folder's safetensors files read straight onto a device, bit for bit as stored.

transformers' loader and `safetensors.load_file` touch the file through a memory map, one tensor at a
time, and copy each to the GPU from pageable pages: GLM-5 4-layer's 11.5 GB took 6.3 s on an H200 host
whose page cache reads at 5.7 GB/s and whose pinned copies run at 55 GB/s. Here each file's data
section is read in chunks by several threads at once (`os.preadv`, which releases the GIL) into a few
reused pinned buffers, and each filled chunk is copied to one device buffer asynchronously while the
next ones are read. The tensors are views into that buffer, with the header's names, dtypes and shapes.
On CPU a memory map is faster (no copy at all), so CPU runs keep transformers' own load; the staged
path runs in CI with plain buffers (tests/unit/test_engine_read.py).
"""

from __future__ import annotations

import json
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rlsmoke.errors import CheckpointError

CHUNK_BYTES = 32 << 20
READERS = 4  # threads reading a file at once; each has a pinned buffer of its own on a GPU
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}  # fmt: skip


FIX = "run `rlsmoke verify CASE`, or `rlsmoke prepare CASE --force` to build it again"


def read_checkpoint(folder: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of `folder`'s *.safetensors files, on `device`. Raises CheckpointError (rule
    checkpoint.load) on a file whose header or size does not describe its tensors."""
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(read_file(path, torch.device(device)))
    return tensors


def read_file(path: Path, device: torch.device, *, staged: bool = False) -> dict[str, torch.Tensor]:
    """`staged` reads through the reused buffers, always off CPU; on CPU (where they are plain memory) on
    request, so the path a GPU takes runs in CI too."""
    header, start, size = _header(path)
    data = torch.empty(size, dtype=torch.uint8, device=device)
    fd = os.open(path, os.O_RDONLY)
    try:
        if staged or device.type != "cpu":
            _read_staged(fd, start, data)
        else:
            _read_into(fd, start, data)
    finally:
        os.close(fd)
    return {name: _view(data, name, info, path) for name, info in header.items()}


def _header(path: Path) -> tuple[dict, int, int]:
    def broken(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint file {path} {why}", rule="checkpoint.load", fix=FIX)

    file_size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise broken("is shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > file_size:
            raise broken(f"declares a {n}-byte header in a {file_size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise broken(f"has a header that is not JSON ({exc})") from None
    header.pop("__metadata__", None)
    size = file_size - 8 - n
    for name, info in header.items():
        begin, end = info.get("data_offsets", (0, -1))
        if info.get("dtype") not in DTYPES or not 0 <= begin <= end <= size:
            raise broken(f"describes tensor {name} outside its data ({info})")
    return header, 8 + n, size


def _chunks(size: int):
    return [(off, min(CHUNK_BYTES, size - off)) for off in range(0, size, CHUNK_BYTES)]


def _pread_full(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        got = os.preadv(fd, [view], offset)
        if got <= 0:
            raise CheckpointError(f"checkpoint file ended early at byte {offset}", rule="checkpoint.load", fix=FIX)
        view, offset = view[got:], offset + got


def _read_into(fd: int, start: int, data: torch.Tensor) -> None:
    dest = memoryview(data.numpy())
    with ThreadPoolExecutor(READERS) as pool:
        list(pool.map(lambda c: _pread_full(fd, dest[c[0] : c[0] + c[1]], start + c[0]), _chunks(data.numel())))


def _read_staged(fd: int, start: int, data: torch.Tensor) -> None:
    """READERS threads fill their buffers (pinned on a GPU); each filled buffer goes to `data`
    asynchronously, and is read into again once that copy has finished."""
    chunks = _chunks(data.numel())
    cuda = data.device.type == "cuda"
    buffers = [torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=cuda) for _ in range(min(READERS, len(chunks)))]
    views = [memoryview(b.numpy()) for b in buffers]

    def read(i: int) -> int:
        off, n = chunks[i]
        _pread_full(fd, views[i % len(buffers)][:n], start + off)
        return i

    with ThreadPoolExecutor(max(len(buffers), 1)) as pool:
        pending = [pool.submit(read, i) for i in range(len(buffers))]
        for i, (off, n) in enumerate(chunks):
            k = i % len(buffers)
            pending[i].result()
            data[off : off + n].copy_(buffers[k][:n], non_blocking=cuda)
            if i + len(buffers) < len(chunks):
                if cuda:  # the buffer is free once its copy has left it
                    done = torch.cuda.Event()
                    done.record()
                    done.synchronize()
                pending.append(pool.submit(read, i + len(buffers)))
    if cuda:
        torch.cuda.synchronize(data.device)


def _view(data: torch.Tensor, name: str, info: dict, path: Path) -> torch.Tensor:
    dtype = DTYPES[info["dtype"]]
    begin, end = info["data_offsets"]
    raw = data[begin:end]
    if begin % dtype.itemsize:
        raw = raw.clone()  # a view must start on its dtype's alignment; safetensors does not promise one
    shape = info["shape"]
    if end - begin != dtype.itemsize * math.prod(shape):
        raise CheckpointError(f"checkpoint file {path}: tensor {name} has {end - begin} bytes for shape {shape}",
                              rule="checkpoint.load", fix=FIX)  # fmt: skip
    return raw.view(dtype).reshape(shape)
