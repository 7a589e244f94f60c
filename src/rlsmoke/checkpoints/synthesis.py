"""Synthesize a complete HF checkpoint for a model spec, streamed one chunk at a time.

Names and shapes come from transformers (the meta-device model mapped back to the hub layout). Chunk i of
a tensor comes from sha256(seed, name, i), so layout and thread count change no byte and pruning 8
synthesized layers to 4 equals synthesizing 4. lm_head's std LOGIT_STD / sqrt(hidden) keeps a few tokens
dominant (`next_token_entropy`); its rows beyond the fixture tokenizer's vocab are zero.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlsmoke.artifacts import write_atomic
from rlsmoke.checkpoints.cache_paths import cache_home
from rlsmoke.checkpoints.make_tokenizer import EOS_TOKENS
from rlsmoke.checkpoints.safety import atomic_dir, check_target
from rlsmoke.checkpoints.shards import (
    CHUNK_BYTES,
    DEFAULT_MAX_SHARD_BYTES,
    DTYPE_NAMES,
    DTYPE_SIZES,
    DTYPES,
    TensorPlan,
    progress_bar,
    tensor_bytes,
    write_shards,
)
from rlsmoke.errors import CheckpointError
from rlsmoke.models import ModelSpec, model_spec
from rlsmoke.shipped import FIXTURES

LOGIT_STD = 8.0  # logits ~ N(0, 8^2): measured next-token entropy ~1.1 nats on the tiny widths (uniform: 8.3)
INIT_STD = 0.02  # std of every other matrix, as transformers' initializer_range
FIXTURE_TOKENIZER = FIXTURES / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # the choices of `prepare --dtype`


@dataclass(frozen=True)
class Layout:
    """What a checkpoint of a config holds on disk: {tensor: (safetensors dtype, shape)}."""

    tensors: dict[str, tuple[str, tuple[int, ...]]]

    @property
    def nbytes(self) -> int:
        return sum(math.prod(s) * DTYPE_SIZES[d] for d, s in self.tensors.values())


# Bump when expected_layout answers differently for the same config, dtype and transformers version.
LAYOUT_VERSION = 1


def expected_layout(cfg, dtype: torch.dtype = torch.bfloat16) -> Layout:
    """Names, dtypes and shapes `from_pretrained` expects for `cfg`; cached, as they take 0.3 s a verify."""
    import transformers

    key = json.dumps({"config": cfg.to_dict(), "dtype": str(dtype), "transformers": transformers.__version__,
                      "version": LAYOUT_VERSION}, sort_keys=True, default=str)  # fmt: skip
    memo = cache_home() / "layouts" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    # none yet, or unreadable: computed again
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        tensors = json.loads(memo.read_text())
        return Layout({name: (dtype_name, tuple(shape)) for name, (dtype_name, shape) in tensors.items()})
    layout = _built_layout(cfg, dtype, transformers)
    with contextlib.suppress(OSError):  # a read-only cache: the next verify computes it again
        memo.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(memo, json.dumps(layout.tensors))  # a concurrent reader never sees half
    return layout


def _built_layout(cfg, dtype: torch.dtype, transformers) -> Layout:
    from transformers.core_model_loading import revert_weight_conversion

    arch = cfg.architectures[0]
    if (cls := getattr(transformers, arch, None)) is None:
        raise CheckpointError(
            f"config.json: architectures={arch!r} is not a transformers class",
            rule="checkpoint.config",
            fix="use a native dialect (patch --dialect glm_moe_dsa) or a supported model",
        )
    with torch.device("meta"):  # on a copy: building sets fields on the config (its key would change)
        model = cls._from_config(copy.deepcopy(cfg), dtype=dtype)
    state = revert_weight_conversion(model, model.state_dict())
    return Layout({k: (DTYPE_NAMES[v.dtype], tuple(v.shape)) for k, v in state.items()})


def _chunk_seed(seed: int, name: str, i: int) -> int:
    h = hashlib.sha256(f"{seed}\0{name}\0{i}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


UNIFORM_LEVELS_STD = math.sqrt((128**2 - 1) / 12) / 128  # std of the 128 levels below


def uniform_levels(rng: np.random.Generator, n: int, std: float, dtype: torch.dtype) -> torch.Tensor:
    """n values, mean 0, std `std`, uniform over 128 levels: 3x torch's normal_, the same bits everywhere."""
    bits = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    bits &= 0x7F
    bits |= 0x3F80  # bf16 with sign 0 and exponent 127: 1 + k/128, k = 0..127 from 7 random bits
    t = torch.from_numpy(bits).view(torch.bfloat16)
    t.sub_(1.5).add_(1 / 256)  # exactly (2k + 1 - 128) / 256: symmetric, mean 0, all exact in bf16
    return t.to(dtype).mul_(std / UNIFORM_LEVELS_STD)


def _special_init(name: str, shape: tuple[int, ...], g: torch.Generator, cfg) -> torch.Tensor | None:
    """Tensors not drawn with std INIT_STD: norms, biases, gates. Values follow transformers' _init_weights."""
    leaf = name.rsplit(".", 1)[-1]
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    if "norm" in module:  # RMSNorm, LayerNorm, q_a_layernorm, k_norm, norm1, ...: weight 1, bias 0
        return torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    if leaf in ("bias", "e_score_correction_bias", "index_kpool_compress_ape") or leaf.endswith("_base"):
        return torch.zeros(shape)
    if leaf == "index_kpool_compress_gate" or (leaf.startswith("hc_") and leaf.endswith("_scale")):
        return torch.ones(shape)
    if leaf == "A_log":
        # KDA forget gate: zero under the safe-gate lower bound, else log U(1, 16) (FLA's init).
        if getattr(cfg, "linear_lower_bound", None) is not None:
            return torch.zeros(shape)
        return torch.empty(shape).uniform_(1.0, 16.0, generator=g).log()
    if leaf == "dt_bias":
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=g).exp().clamp_min(1e-4)
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    return None


def _text_config(cfg):
    return getattr(cfg, "text_config", None) or cfg


def tensor_plan(
    name: str, dtype: str, shape: tuple[int, ...], cfg, seed: int, tokenizer_vocab: int
) -> TensorPlan:
    """How to make one tensor, chunk by chunk, from (seed, name)."""
    tdtype = DTYPES[dtype]
    text = _text_config(cfg)
    per = CHUNK_BYTES // DTYPE_SIZES[dtype]  # elements in a chunk
    std = INIT_STD
    zero_from = None  # flat index from which the tensor is zero
    if name == "lm_head.weight":
        std = LOGIT_STD / math.sqrt(shape[1])
        zero_from = min(tokenizer_vocab, shape[0]) * shape[1]

    def chunk(i: int) -> memoryview:
        g = torch.Generator().manual_seed(_chunk_seed(seed, name, i))
        n = math.prod(shape)
        lo, hi = i * per, min(n, (i + 1) * per)
        if i == 0 and (special := _special_init(name, shape, g, text)) is not None:
            assert n <= per, f"{name}: special init of {n} elements spans chunks"
            return tensor_bytes(special.to(tdtype).reshape(-1))
        t = uniform_levels(np.random.default_rng(_chunk_seed(seed, name, i)), hi - lo, std, tdtype)
        if zero_from is not None and hi > zero_from:
            t[max(0, zero_from - lo) :] = 0
        return tensor_bytes(t)

    return TensorPlan(name, dtype, shape, chunk)


def synth_config(spec: ModelSpec, dtype: torch.dtype):
    """The transformers config of `spec`, with the fixture tokenizer's special token ids."""
    from rlsmoke.models.hf import hf_config

    cfg = hf_config(spec)
    tok = tokenizer_ids()
    for c in {id(cfg): cfg, id(_text_config(cfg)): _text_config(cfg)}.values():
        c.eos_token_id = tok["eos"][0]
        c.pad_token_id = tok["pad"]
        c.bos_token_id = None
        c.dtype = dtype
        if hasattr(c, "num_nextn_predict_layers"):  # no MTP tensors are synthesized: else SGLang's MTP looks
            c.num_nextn_predict_layers = 0
    return cfg


def tokenizer_ids() -> dict:
    vocab = json.loads((FIXTURE_TOKENIZER / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    size = 1 + max([*vocab["model"]["vocab"].values(), *ids.values()])
    return {"eos": [ids[t] for t in EOS_TOKENS], "pad": ids["<|pad|>"], "size": size}


def synthesize(
    case: str | ModelSpec,
    out: Path | str,
    *,
    tiny: bool = False,
    dtype: str = "bf16",
    seed: int = 0,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    force: bool = False,
    manifest: bool = True,
    workers: int | None = None,
    progress: bool = False,
) -> Path:
    """Write a complete HF checkpoint of `case` (a name or a ModelSpec) into `out`, atomically."""
    spec = case if isinstance(case, ModelSpec) else model_spec(case, tiny=tiny)
    out = Path(out)
    check_target(out, force)
    with atomic_dir(out, synth_bytes(spec, dtype), force=force) as tmp:
        synthesize_into(tmp, spec, dtype=dtype, seed=seed, max_shard_bytes=max_shard_bytes, manifest=manifest,
                        workers=workers, progress=progress)  # fmt: skip
    return out.absolute()


def synth_bytes(spec: ModelSpec, dtype: str = "bf16") -> int:
    tdtype = TORCH_DTYPES[dtype]
    return expected_layout(synth_config(spec, tdtype), tdtype).nbytes


def synthesize_into(
    folder: Path, spec: ModelSpec, *, dtype: str = "bf16", seed: int = 0, progress: bool = False, **shards
) -> None:
    """synthesize() without the safety wrapper: writes into an existing empty folder; `shards`: the shard
    options of `write_shards`."""
    tdtype = TORCH_DTYPES[dtype]
    cfg = synth_config(spec, tdtype)
    layout = expected_layout(cfg, tdtype)
    tok = tokenizer_ids()
    plans = [tensor_plan(k, d, s, cfg, seed, tok["size"]) for k, (d, s) in layout.tensors.items()]
    cfg.to_json_file(folder / "config.json", use_diff=False)
    gen = {"eos_token_id": tok["eos"], "pad_token_id": tok["pad"], "do_sample": True, "temperature": 1.0}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for f in TOKENIZER_FILES:  # the fixture tokenizer
        shutil.copyfile(FIXTURE_TOKENIZER / f, folder / f)
    with progress_bar(layout.nbytes, f"synthesize {spec.name}", progress) as bar:
        write_shards(folder, plans, progress=bar, **shards)


def next_token_entropy(model, vocab: int, *, n_seq: int = 8, seq_len: int = 32, seed: int = 0) -> float:
    """Mean entropy (nats) of the model's next-token distribution over random in-vocab contexts."""
    ids = torch.randint(0, vocab, (n_seq, seq_len), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits, dim=-1)
    return float(-(logp.exp() * logp).sum(-1).mean())
