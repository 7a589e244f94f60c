"""The megatron trainer: megatron-core's GPTModel with the plan's layout, fed through the bridge.

megatron-core is optional (`pip install rlsmoke[megatron]`); nothing here is imported by `rlsmoke plan`.
"""


def refusal(case) -> str:
    """Why the megatron trainer cannot run `case` ("" when it can): read before anything loads."""
    if case.spec().family == "glm5.3-flash":
        return (f"case={case.name}: megatron-core has no KDA linear attention nor hyper-connections "
                "(the bridge of GLM-5.3-Flash is still round-tripped)")  # fmt: skip
    if case.num_gpus > 1 or (case.mode or "colocate") != "colocate":
        return f"case={case.name}: the megatron trainer runs colocated on one device (world size 1)"
    return ""


def available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no `megatron` package at all
        return False
