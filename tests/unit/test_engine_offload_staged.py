"""The pageable offload's staged copies: each large tensor goes through two reused staging buffers in
chunks, and comes back bit for bit. On CPU the same chunking runs with plain buffers; on a CUDA host the
buffers are pinned and the device side is asynchronous."""

import pytest
import torch

from rlsmoke.engine import offload
from rlsmoke.engine.offload import HostCopies

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# sizes around the chunk: below it (a plain copy), one exact chunk, and an odd tail over several chunks
SHAPES = [(7,), (256,), (3, 1000), (5, 7, 129)]
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]


def _staged(device: str) -> HostCopies:
    copies = HostCopies(device)
    copies.pin, copies.staged = False, True  # as on a host whose RAM cannot pin what the run parks
    return copies


def _tensor(shape, dtype, device):
    g = torch.Generator().manual_seed(sum(shape))
    if dtype == torch.bool:
        return (torch.rand(shape, generator=g) > 0.5).to(device)
    if dtype == torch.int64:
        return torch.randint(-(2**62), 2**62, shape, generator=g).to(device)
    x = torch.randn(shape, generator=g).to(dtype)
    x.view(-1)[0] = float("nan")  # the bits move, not the values: a NaN comes back as the same NaN
    return x.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_staged_round_trip_is_bit_identical(monkeypatch, device, dtype, shape):
    monkeypatch.setattr(offload, "STAGING_BYTES", 1024)
    copies = _staged(device)
    t = _tensor(shape, dtype, device)
    host = copies.to_host(t)
    assert (
        host.device.type == "cpu" and not host.is_pinned() and host.shape == t.shape and host.dtype == t.dtype
    )
    back = copies.to_device(host)
    assert back.device == t.device
    assert torch.equal(offload._byte_view(back), offload._byte_view(t))
    if t.numel() * t.element_size() > 1024:
        assert len(copies._staging) == 2  # the chunks went through the two buffers, reused


@pytest.mark.parametrize("device", DEVICES)
def test_a_wrong_chunk_order_would_be_seen(monkeypatch, device):
    """The twin: a staging that copies each chunk at the previous chunk's offset leaves the tail unwritten."""
    monkeypatch.setattr(offload, "STAGING_BYTES", 1024)
    real = HostCopies._chunks

    def shifted(self, nbytes):
        chunks = list(real(self, nbytes))
        return [(k, chunks[max(i - 1, 0)][1], n) for i, (k, _, n) in enumerate(chunks)]

    monkeypatch.setattr(HostCopies, "_chunks", shifted)
    # a freed host block holding the same bytes would hide the unwritten tail: the values are drawn for this
    # test alone, and their host tensor stays alive (freed, the host copy would reuse its block on a GPU)
    source = torch.randn(5, 999, generator=torch.Generator().manual_seed(987654))
    t = source.to(device)
    assert not torch.equal(offload._byte_view(_staged(device).to_host(t)), offload._byte_view(source))


def test_a_cuda_park_pins_only_what_is_cheaper_to_pin_than_to_stage(monkeypatch):
    """Pinned up to PIN_MAX_BYTES a rank, where the host can spare twice what its ranks park; past
    either, the parked tensors stage (GLM-4.5 4-layer's 12 GiB rollout copy: staged). Nothing here
    touches a device: the rule is decided from the sizes."""
    monkeypatch.setattr(offload, "host_memory_bytes", lambda: 128 << 30)
    small, large = offload.PIN_MAX_BYTES, offload.PIN_MAX_BYTES + 1
    assert (HostCopies("cuda", park_bytes=small).pin, HostCopies("cuda", park_bytes=small).staged) == (
        True,
        False,
    )
    assert (HostCopies("cuda", park_bytes=large).pin, HostCopies("cuda", park_bytes=large).staged) == (
        False,
        True,
    )
    assert not HostCopies("cuda", park_bytes=small, ranks_on_host=9).pin  # 2 x 9 x 4 GiB > half of 128 GiB
    assert not HostCopies("cpu", park_bytes=small).pin and not HostCopies("cpu", park_bytes=small).staged


@pytest.mark.parametrize("device", DEVICES)
def test_a_second_park_reuses_the_host_pages_and_holds_the_new_values(monkeypatch, device):
    """A parameter parks once a phase: its host copy is kept for the next park (fresh pageable memory faults
    in page by page, seconds for GLM-4.5's 12.9 GB), and the next park overwrites all of it."""
    monkeypatch.setattr(offload, "STAGING_BYTES", 1024)
    copies = _staged(device)
    weight = torch.nn.Parameter(_tensor((5, 7, 129), torch.float32, device))
    first = copies.to_host(weight.data, weight)
    weight.data = copies.to_device(first)
    weight.data.mul_(-2.0)  # a step between the parks
    second = copies.to_host(weight.data, weight)
    assert second.data_ptr() == first.data_ptr()
    assert torch.equal(offload._byte_view(second), offload._byte_view(weight.data.cpu()))
    assert copies.to_host(weight.data).data_ptr() != first.data_ptr()  # no key: a fresh copy, as before
