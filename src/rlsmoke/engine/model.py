"""Loading the policy: the prepared HF checkpoint through `from_pretrained`, as the real flow does."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.utils.deterministic
import transformers

from rlsmoke.checkpoints import prepare
from rlsmoke.checkpoints.identity import check_checkpoint
from rlsmoke.checkpoints.verification import verify
from rlsmoke.engine import kda
from rlsmoke.engine.read import read_checkpoint
from rlsmoke.errors import CheckpointError
from rlsmoke.models import ModelSpec, model_spec

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_dir(case: str, *, tiny: bool, given: Path | None = None) -> Path:
    """The checkpoint folder: the one given, or `rlsmoke.checkpoints.prepare`'s cached one."""
    if given is None:
        return Path(prepare(case, tiny=tiny))  # verified as it is built, and on every cache hit
    given = Path(given)
    if not (given / "config.json").is_file():
        raise CheckpointError(
            f"checkpoint={given} is missing (no config.json)",
            rule="checkpoint.exists",
            fix=f"run `rlsmoke prepare {case}` or pass an existing --checkpoint DIR",
        )
    verify(given, checksums=False)  # headers and lengths: a truncated shard is named here, not by a loader
    check_checkpoint(given, model_spec(case, tiny=tiny))  # this case's model, every byte as its manifest says
    return given


def process_settings(threads: int | None) -> None:
    """Per-process settings, in the driver, a Ray actor or a rank: the same seed must give the same bits."""
    if threads:
        torch.set_num_threads(threads)
    # CPU backward (MoE index ops) is nondeterministic in the last bits with more threads (measured)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # a run's first seed: `reuse.first_seed_only`
    if torch.cuda.is_available():  # cuDNN's SDPA plans every new shape and has a nondeterministic backward
        torch.backends.cuda.enable_cudnn_sdp(False)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def model_class(spec: ModelSpec):
    if spec.hf_model_type == "glm5_next":
        # AutoModelForCausalLM rejects the composite config; text-only input works on this class.
        return transformers.Glm5NextForConditionalGeneration
    return transformers.AutoModelForCausalLM


def load_policy(path: Path, spec: ModelSpec, dtype: str, device: str,
                state: dict[str, torch.Tensor] | None = None):  # fmt: skip
    """The model in `dtype` on `device`, in eval mode; from `state` (tensors already read) when given."""
    kda.install(kda.choose(device, spec.family))  # before the first forward: the layer looks it up per call
    try:
        if state is not None:
            model = from_state_dict(path, spec, dtype, device, state)
        elif device.startswith("cuda"):
            # the files straight onto the GPU (engine.read), where transformers then fuses the experts
            model = from_state_dict(path, spec, dtype, device, read_checkpoint(path, device))
        else:  # a memory map: transformers' own load copies nothing it does not convert
            model = model_class(spec).from_pretrained(path, dtype=TORCH_DTYPES[dtype])
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint={path} does not load: {first}",
            rule="checkpoint.load",
            fix=f"run `rlsmoke verify {spec.name}` or `rlsmoke prepare {spec.name} --force`",
        ) from None
    return model.to(device).eval()


def from_state_dict(path: Path, spec: ModelSpec, dtype: str, device: str, state: dict[str, torch.Tensor]):
    """The model of `path` from its tensors `state`, as `from_pretrained(path)` builds it."""
    cls = model_class(spec)
    config = transformers.AutoConfig.from_pretrained(path)
    # the Auto class loads from a folder only: its concrete class takes a state
    if cls.__name__.startswith("Auto"):
        cls = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    where = {"device_map": device} if device.startswith("cuda") else {}
    model = cls.from_pretrained(None, config=config, state_dict=state, dtype=TORCH_DTYPES[dtype], **where)
    if (Path(path) / "generation_config.json").is_file():  # what from_pretrained(path) reads too
        model.generation_config = transformers.GenerationConfig.from_pretrained(path)
    return model


@torch.no_grad()
def derive_policy(source, spec: ModelSpec, dtype: str):
    """A copy of `source` in `dtype` as `load_policy` would load it, without a second read (bit-identical)."""
    device = next(source.parameters()).device
    with torch.device("meta"):
        copy = type(source)._from_config(source.config, dtype=TORCH_DTYPES[dtype])
    copy = copy.to_empty(device=device)
    for kind in ("named_parameters", "named_buffers"):
        theirs = getattr(source, kind)(remove_duplicate=False)
        for (name, t), (src_name, q) in zip(getattr(copy, kind)(remove_duplicate=False), theirs, strict=True):
            assert name == src_name, (name, src_name)
            t.copy_(q)
    copy.generation_config = source.generation_config
    return copy.eval()


def load_tokenizer(path: Path):
    return transformers.AutoTokenizer.from_pretrained(path)
