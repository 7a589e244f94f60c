"""The megatron trainer: megatron-core's GPTModel with the plan's layout, fed through the bridge.

megatron-core is optional (`pip install rlsmoke[megatron]`); nothing here is imported by `rlsmoke plan`.
"""


def available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no `megatron` package at all
        return False
