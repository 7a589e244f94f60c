"""A checkpoint folder's safetensors files read straight onto a device, bit for bit as stored.

transformers' loader copies one memory-mapped tensor at a time from pageable pages (GLM-5 4-layer's
11.5 GB took 6.3 s on an H200 host). Here several threads read chunks (`os.preadv`) into reused pinned
buffers, each copied to one device buffer asynchronously. CPU runs keep transformers' memory map; the
staged path runs in CI with plain buffers.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.utils.deterministic as det

from rlsmoke.checkpoints.shards import CHUNK_BYTES, DTYPES, read_header
from rlsmoke.errors import CheckpointError

READERS = 4  # threads reading a file at once; each has a buffer of CHUNK_BYTES of its own (pinned on a GPU)


@contextlib.contextmanager
def unfilled():
    """torch.empty without deterministic algorithms' NaN fill (5 of 5.9 s of a 1.1 B megatron build)."""
    before = det.fill_uninitialized_memory
    det.fill_uninitialized_memory = False
    try:
        yield
    finally:
        det.fill_uninitialized_memory = before


def read_checkpoint(folder: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of `folder`'s *.safetensors files, on `device`; a file cut since is refused."""
    device, files = torch.device(device), sorted(Path(folder).glob("*.safetensors"))
    return {k: t for path in files for k, t in read_file(path, device).items()}


def read_file(path: Path, device: torch.device, *, staged: bool = False) -> dict[str, torch.Tensor]:
    """`staged`: through the reused buffers, always off CPU and on request on CPU (CI)."""
    entries = read_header(path)
    start = min((e.begin for e in entries.values()), default=0)
    with unfilled():  # every byte is read into it
        data = torch.empty(max((e.end for e in entries.values()), default=start) - start, dtype=torch.uint8,
                           device=device)  # fmt: skip
    fd = os.open(path, os.O_RDONLY)
    try:
        (_read_staged if staged or device.type != "cpu" else _read_into)(fd, start, data)
    except EOFError as exc:  # cut after it was verified
        raise CheckpointError(f"checkpoint file {path} {exc}", rule="checkpoint.load",
                              fix="run `rlsmoke verify CASE`, or `rlsmoke prepare CASE --force`") from None  # fmt: skip
    finally:
        os.close(fd)
    return {name: _view(data[e.begin - start : e.end - start], DTYPES[e.dtype], e.shape)
            for name, e in entries.items()}  # fmt: skip


def _chunks(size: int):
    return [(off, min(CHUNK_BYTES, size - off)) for off in range(0, size, CHUNK_BYTES)]


def _pread_full(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        if (got := os.preadv(fd, [view], offset)) <= 0:
            raise EOFError(f"ends before byte {offset}")
        view, offset = view[got:], offset + got


def _read_into(fd: int, start: int, data: torch.Tensor) -> None:
    dest = memoryview(data.numpy())
    with ThreadPoolExecutor(READERS) as pool:
        list(
            pool.map(lambda c: _pread_full(fd, dest[c[0] : c[0] + c[1]], start + c[0]), _chunks(data.numel()))
        )


def _read_staged(fd: int, start: int, data: torch.Tensor) -> None:
    """READERS threads fill buffers; each goes to `data` asynchronously and is refilled once copied."""
    chunks = _chunks(data.numel())
    cuda = data.device.type == "cuda"
    buffers = [
        torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=cuda) for _ in range(min(READERS, len(chunks)))
    ]
    views = [memoryview(b.numpy()) for b in buffers]

    def read(i: int) -> None:
        off, n = chunks[i]
        _pread_full(fd, views[i % len(buffers)][:n], start + off)

    with ThreadPoolExecutor(max(len(buffers), 1)) as pool:
        pending = [pool.submit(read, i) for i in range(len(buffers))]
        for i, (off, n) in enumerate(chunks):
            pending[i].result()
            data[off : off + n].copy_(buffers[i % len(buffers)][:n], non_blocking=cuda)
            if i + len(buffers) < len(chunks):
                if cuda:  # the buffer is free once its copy has left it
                    torch.cuda.current_stream().synchronize()
                pending.append(pool.submit(read, i + len(buffers)))
    if cuda:
        torch.cuda.synchronize(data.device)


def _view(raw: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if raw.storage_offset() % dtype.itemsize:
        raw = raw.clone()  # a view must start on its dtype's alignment; safetensors does not promise one
    return raw.view(dtype).reshape(shape)
