"""The sizes a user gives: `--set KEY=VALUE` overrides, NUM_GPUS and --gpus-per-node, typed and bounded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlsmoke.errors import RlsmokeError, UnknownNameError
from rlsmoke.facts import DEFAULT_GPUS_PER_NODE

# Upper bounds on user sizes, so no plan loop runs long; far past any Miles job.
MAX_NUM_GPUS = 65536
MAX_GPUS_PER_NODE = 64

# each key's type: pp_layers is a tuple of layer counts
SETTABLE: Mapping[str, type] = {
    "train.tp": int, "train.sp": bool, "train.pp": int, "train.pp_layers": tuple, "train.cp": int,
    "train.ep": int, "train.etp": int,
    "rollout.gpus_per_engine": int, "rollout.tp": int, "rollout.dp": int, "rollout.ep": int,
    "rollout.dp_attention": bool, "rollout.dense_tp_lm_head": bool,
    "actor_gpus": int, "rollout_gpus": int,
}  # fmt: skip
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_overrides(items: list[str] | Mapping[str, object]) -> dict[str, object]:
    """`KEY=VALUE` strings (or a mapping) to typed values. Unknown keys are an error, never ignored."""
    pairs = items.items() if isinstance(items, Mapping) else [_split_kv(s) for s in items]
    out: dict[str, object] = {}
    for key, raw in pairs:
        if key not in SETTABLE:
            raise UnknownNameError(
                f"--set {key}: unknown key", rule="set.known_key", fix=f"use one of: {', '.join(SETTABLE)}"
            )
        out[key] = _coerce(key, SETTABLE[key], raw)
    return out


def _split_kv(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise RlsmokeError(
            f"--set {item!r} is not KEY=VALUE", rule="set.syntax", fix="write e.g. --set rollout.dp=4"
        )
    key, value = item.split("=", 1)
    return key.strip(), value.strip()


def _coerce(key: str, kind: type, raw: Any) -> object:
    """A string value parsed to its kind; a value of a mapping taken as given, its sizes bounded."""
    if kind is bool:
        if not isinstance(raw, str):
            return raw
        if raw.lower() not in _TRUE + _FALSE:
            raise RlsmokeError(
                f"--set {key}={raw} is not a boolean", rule="set.value", fix=f"use {key}=true or false"
            )
        return raw.lower() in _TRUE
    if isinstance(raw, str):
        try:
            raw = int(raw) if kind is int else tuple(int(v) for v in raw.split(","))
        except ValueError:
            raise RlsmokeError(
                f"--set {key}={raw} is not {'an integer' if kind is int else 'a comma list of integers'}",
                rule="set.value",
                fix=f"give {key} a number",
            ) from None
    if kind is tuple:
        return tuple(_in_range(key, int(n)) for n in raw)
    return _in_range(key, raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw


def _in_range(key: str, value: int) -> int:
    if not 0 <= value <= MAX_NUM_GPUS:
        raise RlsmokeError(f"--set {key}={value} is outside [0, {MAX_NUM_GPUS}]", rule="set.range",
                           fix=f"give {key} a size within [0, {MAX_NUM_GPUS}]")  # fmt: skip
    return value


def parse_num_gpus(value: object) -> int:
    try:
        n = int(str(value))
    except ValueError:
        n = 0
    if n < 1:
        raise RlsmokeError(
            f"num_gpus={value!r} must be a positive integer",
            rule="gpus.positive",
            fix="pass --num-gpus N with N >= 1",
        )
    if n > MAX_NUM_GPUS:
        raise RlsmokeError(f"num_gpus={n} is past the largest plan, {MAX_NUM_GPUS} GPUs", rule="gpus.range",
                           fix=f"pass --num-gpus N with 1 <= N <= {MAX_NUM_GPUS}")  # fmt: skip
    return n


def check_gpus_per_node(value: int | None) -> None:
    """--gpus-per-node when given: 0 is a mistake, not the default."""
    if value is not None and not 1 <= value <= MAX_GPUS_PER_NODE:
        raise RlsmokeError(f"gpus_per_node={value} is outside [1, {MAX_GPUS_PER_NODE}]", rule="gpus.per_node",
                           fix=f"pass --gpus-per-node N with 1 <= N <= {MAX_GPUS_PER_NODE}, or leave it out "
                               f"(default {DEFAULT_GPUS_PER_NODE}, or NUM_GPUS when smaller)")  # fmt: skip
