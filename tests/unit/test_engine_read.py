"""A checkpoint read straight onto a device (engine.read), and a model built from it: the same bits as
safetensors' reader and as transformers' `from_pretrained(folder)`. On CPU the staged path runs with
plain buffers; on a GPU host it reads through pinned ones. A damaged file is refused by name."""

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlsmoke.engine import read
from rlsmoke.engine.model import TORCH_DTYPES, checkpoint_dir, from_state_dict, model_class
from rlsmoke.errors import CheckpointError
from rlsmoke.models import model_spec

CASES = ["glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer", "glm5.3-flash-4layer"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype
        and a[k].shape == b[k].shape
        and torch.equal(_bits(a[k].cpu()), _bits(b[k].cpu()))
        for k in a
    )


@pytest.fixture
def odd_file(tmp_path, monkeypatch):
    """Tensors of every width at odd sizes, so that chunks end mid-tensor and a 4-byte tensor follows a
    2-byte one at an offset that is not a multiple of 4; chunks of 1 KiB make many of them."""
    monkeypatch.setattr(read, "CHUNK_BYTES", 1024)
    g = torch.Generator().manual_seed(0)
    tensors = {"a.bf16": torch.randn(333, generator=g).to(torch.bfloat16), "b.f32": torch.randn(7, 129, generator=g),
               "c.i64": torch.randint(-(2**40), 2**40, (77,), generator=g), "d.bool": torch.rand(5, generator=g) > 0.5,
               "e.scalar": torch.tensor(3.5), "f.empty": torch.empty(0, 4)}  # fmt: skip
    path = tmp_path / "model.safetensors"
    save_file(tensors, path)
    return path


@pytest.mark.parametrize(("device", "staged"), [("cpu", False), *((d, True) for d in DEVICES)],
                         ids=lambda v: v if isinstance(v, str) else "staged" if v else "direct")  # fmt: skip
def test_a_file_reads_bit_for_bit_as_safetensors_reads_it(odd_file, device, staged):
    mine = read.read_file(odd_file, torch.device(device), staged=staged)
    assert _same(mine, load_file(odd_file))
    assert {t.device.type for t in mine.values()} == {device}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CASES)
def test_a_model_from_the_read_state_is_from_pretrained_s(name, device):
    """Every parameter and buffer equal to a `from_pretrained(folder)` load in the train dtype: the
    renames, the fused experts, the modules kept in fp32; the generation config comes along."""
    spec = model_spec(name, tiny=True)
    folder = checkpoint_dir(name, tiny=True)
    state = read.read_checkpoint(folder, device)
    assert _same(state, {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()})
    mine = from_state_dict(folder, spec, "float32", device, state)
    ref = model_class(spec).from_pretrained(folder, dtype=TORCH_DTYPES["float32"])
    assert _same(dict(mine.named_parameters()), dict(ref.named_parameters()))
    assert _same(dict(mine.named_buffers()), dict(ref.named_buffers()))
    assert mine.generation_config.to_dict() == ref.generation_config.to_dict()


def test_the_comparison_sees_one_flipped_bit(odd_file):
    """The twin: one bit of one tensor changed on disk is not the same read."""
    before = {k: v.clone() for k, v in load_file(odd_file).items()}  # load_file maps the file: keep a copy
    raw = bytearray(odd_file.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin = json.loads(raw[8 : 8 + n])["b.f32"]["data_offsets"][0]
    raw[8 + n + begin + 5] ^= 1
    odd_file.write_bytes(bytes(raw))
    assert not _same(read.read_file(odd_file, torch.device("cpu"), staged=True), before)


@pytest.mark.parametrize("damage", ["truncated", "header-length", "offsets"])
def test_a_damaged_file_is_refused_by_name_before_it_is_read(tmp_path, damage):
    """Every load reads a checkpoint that `verify` passed (`checkpoint_dir`): a damaged header or a short
    file is named there. A file cut after that check is named by the read itself."""
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dir(CASES[0], tiny=True), folder)
    shard = next(folder.glob("*.safetensors"))
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    if damage == "truncated":
        raw = raw[:-100]
    elif damage == "header-length":
        raw[:8] = struct.pack("<Q", len(raw) + 1)
    else:
        header = json.loads(raw[8 : 8 + n])
        first = next(k for k in header if k != "__metadata__")
        header[first]["data_offsets"] = [0, 10**9]
        raw[8 : 8 + n] = json.dumps(header).encode().ljust(n)[:n]
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as err:
        checkpoint_dir(CASES[0], tiny=True, given=folder)
    assert err.value.rule == "checkpoint.verify" and shard.name in str(err.value)
    if damage == "truncated":
        with pytest.raises(CheckpointError) as err:
            read.read_file(shard, torch.device("cpu"), staged=True)
        assert (
            err.value.rule == "checkpoint.load"
            and str(shard) in str(err.value)
            and "rlsmoke verify" in err.value.fix
        )
