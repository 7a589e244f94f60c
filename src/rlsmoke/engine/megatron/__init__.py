"""The megatron trainer (`pip install rlsmoke[megatron]`); nothing here is imported by `rlsmoke plan`."""

# the trainer's modeling modules, imported with the engine (not in the load), as transformers' modeling is
MODULES = ("megatron.core.models.gpt", "megatron.core.parallel_state")


def refusal(spec, num_gpus: int = 1, mode: str | None = None) -> str:
    """Why the megatron trainer cannot run `spec` at `num_gpus` in `mode` ("" when it can)."""
    if spec.family == "glm5.3-flash":
        return (f"case={spec.name}: megatron-core has no KDA linear attention nor hyper-connections "
                "(the bridge of GLM-5.3-Flash is still round-tripped)")  # fmt: skip
    if num_gpus > 1 or (mode or "colocate") != "colocate":
        return f"case={spec.name}: the megatron trainer runs colocated on one device (world size 1)"
    return ""


# what the megatron trainer does not wire (megatron-core has each; the one-step check needs none of them)
UNWIRED = ("train-dropout", "gradient checkpointing", "a KL loss")


def unwired(*, inject: str = "", gradient_checkpointing: bool = False, kl_coef: float = 0.0) -> str:
    """Which of the asked options the megatron trainer does not wire ("" when none)."""
    asked = [inject.startswith("train-dropout"), gradient_checkpointing, bool(kl_coef)]
    missing = [name for name, on in zip(UNWIRED, asked, strict=True) if on]
    return f"the megatron trainer runs without {', '.join(missing)}" if missing else ""


def available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no `megatron` package at all
        return False
