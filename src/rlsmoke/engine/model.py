"""Loading the policy: the prepared HF checkpoint through `from_pretrained`, as the real flow does."""

from __future__ import annotations

from pathlib import Path

import torch

from rlsmoke.errors import CheckpointError
from rlsmoke.models import ModelSpec

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_dir(case: str, *, tiny: bool, seed: int = 0, given: Path | None = None) -> Path:
    """The checkpoint folder: the one given, or `rlsmoke.checkpoints.prepare`'s cached one."""
    if given is None:
        from rlsmoke.checkpoints import prepare

        given = Path(prepare(case, tiny=tiny, seed=seed))
    given = Path(given)
    if not (given / "config.json").is_file():
        raise CheckpointError(
            f"checkpoint={given} is missing (no config.json)",
            rule="checkpoint.exists",
            fix=f"run `rlsmoke prepare {case}` or pass an existing --checkpoint DIR",
        )
    return given


def model_class(spec: ModelSpec):
    import transformers

    if spec.hf_model_type == "glm5_next":
        # AutoModelForCausalLM rejects the composite config; text-only input works on this class.
        return transformers.Glm5NextForConditionalGeneration
    return transformers.AutoModelForCausalLM


def load_policy(path: Path, spec: ModelSpec, dtype: str, device: str):
    """The model in `dtype` on `device`, in eval mode. Raises CheckpointError on a broken folder."""
    try:
        model = model_class(spec).from_pretrained(path, dtype=TORCH_DTYPES[dtype])
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint={path} does not load: {first}",
            rule="checkpoint.load",
            fix=f"run `rlsmoke verify {spec.name}` or `rlsmoke prepare {spec.name} --force`",
        ) from None
    return model.to(device).eval()


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)

