"""Fault injection: each way a checkpoint can be broken is caught by verify, naming the file."""

import json
import shutil
import struct

import pytest

from rlsmoke.checkpoints import safety, synthesize, verify
from rlsmoke.checkpoints.shards import INDEX_NAME, load_index
from rlsmoke.errors import CheckpointError, RlsmokeError

CASE = "glm4.5-355b-a32b-4layer"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return synthesize(CASE, tmp_path_factory.mktemp("v") / "ckpt", tiny=True, max_shard_bytes=2_000_000)


@pytest.fixture
def ckpt(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "ckpt")


def shards(folder):
    return sorted(set(load_index(folder).values()))


def rewrite_header(path, edit):
    """Re-encode a shard's header through `edit(header)`, keeping the data bytes."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])


def first_tensor(path):
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    header = json.loads(path.read_bytes()[8 : 8 + n])
    return next(k for k in header if k != "__metadata__")


def truncate(folder):
    s = folder / shards(folder)[-1]
    s.write_bytes(s.read_bytes()[:-100])
    return s.name, "truncated"


def corrupt_header_bytes(folder):
    s = folder / shards(folder)[0]
    raw = bytearray(s.read_bytes())
    raw[8:16] = b"\xff" * 8
    s.write_bytes(bytes(raw))
    return s.name, "header"


def corrupt_header_length(folder):
    s = folder / shards(folder)[0]
    s.write_bytes(struct.pack("<Q", 2**40) + s.read_bytes()[8:])
    return s.name, "header length"


def missing_shard(folder):
    s = folder / shards(folder)[1]
    s.unlink()
    return s.name, "missing"


def extra_tensor(folder):
    """A tensor appended to a shard (valid bytes) that the index does not list."""
    s = folder / shards(folder)[0]

    def edit(h):
        end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
        h["model.layers.0.extra.weight"] = {"dtype": "BF16", "shape": [4], "data_offsets": [end, end + 8]}

    rewrite_header(s, edit)
    s.write_bytes(s.read_bytes() + b"\0" * 8)
    return s.name, "model.layers.0.extra.weight"


def tensor_missing_from_shard(folder):
    index = json.loads((folder / INDEX_NAME).read_text())
    index["weight_map"]["model.layers.0.ghost.weight"] = shards(folder)[0]
    (folder / INDEX_NAME).write_text(json.dumps(index))
    return shards(folder)[0], "model.layers.0.ghost.weight"


def wrong_dtype_length(folder):
    s = folder / shards(folder)[0]
    name = first_tensor(s)

    def edit(h):
        h[name]["dtype"] = "F32" if h[name]["dtype"] == "BF16" else "BF16"

    rewrite_header(s, edit)
    return s.name, name


def path_in_index(folder, bad):
    index = json.loads((folder / INDEX_NAME).read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = bad
    (folder / INDEX_NAME).write_text(json.dumps(index))
    return INDEX_NAME, name


def config_layers(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    for per_layer in ("layer_types", "mlp_layer_types"):
        cfg.pop(per_layer, None)  # transformers derives them again
    (folder / "config.json").write_text(json.dumps(cfg))
    return "config.json", "model.layers.4."


def config_width(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = 8192
    (folder / "config.json").write_text(json.dumps(cfg))
    return ".safetensors: lm_head.weight", "config.json implies [8192"


def checksum(folder):
    s = folder / shards(folder)[0]
    raw = bytearray(s.read_bytes())
    raw[-1] ^= 0xFF  # structure intact, content not
    s.write_bytes(bytes(raw))
    return s.name, "sha256"


def not_an_object(name):
    def fault(folder):
        (folder / name).write_text("[1]")
        return name, "is not a JSON object (a list)"

    return fault


FAULTS = {
    "truncation": truncate,
    "header-bytes": corrupt_header_bytes,
    "header-length": corrupt_header_length,
    "missing-shard": missing_shard,
    "extra-tensor": extra_tensor,
    "tensor-missing-from-shard": tensor_missing_from_shard,
    "wrong-dtype-length": wrong_dtype_length,
    "path-dotdot": lambda f: path_in_index(f, "../model-00001-of-00005.safetensors"),
    "path-absolute": lambda f: path_in_index(f, "/etc/passwd"),
    "path-subdir": lambda f: path_in_index(f, "sub/model.safetensors"),
    "config-layers": config_layers,
    "config-width": config_width,
    "checksum": checksum,
    "index-not-object": not_an_object(INDEX_NAME),
    "config-not-object": not_an_object("config.json"),
}


def test_pristine_checkpoint_passes(pristine):
    rep = verify(pristine)
    assert rep.checksummed and len(rep.shards) > 2 and not rep.faults


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_is_caught_and_named(fault, ckpt):
    file, detail = FAULTS[fault](ckpt)
    with pytest.raises(CheckpointError) as e:
        verify(ckpt)
    assert isinstance(e.value, RlsmokeError) and isinstance(e.value, ValueError)
    first = str(e.value).split(" (+")[0]
    assert file in first and detail in first, str(e.value)
    assert len(e.value.one_line().splitlines()) == 1


def test_full_disk_is_refused_before_writing(tmp_path, monkeypatch):
    """A full disk, simulated where the preflight reads the free space."""
    monkeypatch.setattr(safety, "disk_free", lambda path: 1000)
    with pytest.raises(CheckpointError, match=r"ckpt: needs .* GB but only 0.00 GB are free"):
        synthesize(CASE, tmp_path / "ckpt", tiny=True)
    assert list(tmp_path.iterdir()) == []


def test_existing_folder_needs_force(pristine, tmp_path):
    out = shutil.copytree(pristine, tmp_path / "ckpt")
    (out / "mine.txt").write_text("user data")
    with pytest.raises(CheckpointError, match="exists and would be overwritten"):
        synthesize(CASE, out, tiny=True)
    assert (out / "mine.txt").exists()
    with pytest.raises(CheckpointError, match="did not write"):  # --force replaces only what rlsmoke built
        synthesize(CASE, out, tiny=True, force=True)
    assert (out / "mine.txt").read_text() == "user data"
    (out / "mine.txt").unlink()
    synthesize(CASE, out, tiny=True, force=True)
    verify(out)


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    from rlsmoke.checkpoints import shards

    def disk_gone(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shards, "write_manifest", disk_gone)
    with pytest.raises(OSError):
        synthesize(CASE, tmp_path / "ckpt", tiny=True)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary sibling
