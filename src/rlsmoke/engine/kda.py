"""KDA, GLM-5.3-Flash's linear attention: flash-linear-attention's Triton kernels where they can run.

transformers' reference KDA is PyTorch loops, the rollout's whole cost. With `fla` importable on CUDA the
engine binds fla's `chunk_kda` / `fused_recurrent_kda` instead; `RLSMOKE_KDA=reference|fla` forces one.
fla compiles and autotunes on first use (minutes on an H200): `warm_up` pays it before the first seed
(`timing.compile_s`), into `$RLSMOKE_CACHE/triton` unless TRITON_CACHE_DIR is set (`rlsmoke.engine`).
"""

from __future__ import annotations

import atexit
import importlib.util
import inspect
import os
import time
from pathlib import Path

import torch

from rlsmoke.engine import fla_configs
from rlsmoke.errors import RlsmokeError

PATHS = ("fla", "reference")
MODELING = "transformers.models.glm5_next.modeling_glm5_next"
# transformers' function name -> fla's, both in fla.ops.kda
KERNELS = {"chunk_kimi_delta_attention": "chunk_kda", "recurrent_kimi_delta_attention": "fused_recurrent_kda"}
# What the layer passes that fla takes; the rest of its **kwargs (attention kwargs) is not fla's.
FLA_KWARGS = set("g beta scale initial_state output_final_state use_qk_l2norm_in_kernel cu_seqlens".split())
_REFERENCE: dict = {}
_DECODE: dict = {}  # the recurrent kernel decode_step calls: fla's or the reference
CONFIGS: dict = {}  # where fla's kernel configs came from (engine.fla_configs.use), for the summary


def fla_available() -> bool:
    return importlib.util.find_spec("fla") is not None


def choose(device: str, family: str) -> str:
    """The KDA path of a run: "" for a model without KDA, else "fla" or "reference"."""
    if family != "glm5.3-flash":
        return ""
    if (asked := os.environ.get("RLSMOKE_KDA", "").strip().lower()) and asked not in PATHS:
        raise RlsmokeError(f"RLSMOKE_KDA={asked!r} is not a KDA path", rule="kda.path",
                           fix=f"set RLSMOKE_KDA to one of: {', '.join(PATHS)}, or unset it")  # fmt: skip
    can_fla = device.startswith("cuda") and fla_available()
    if asked == "fla" and not can_fla:
        raise RlsmokeError("RLSMOKE_KDA=fla needs flash-linear-attention and a CUDA device", rule="kda.path",
                           fix="pip install 'rlsmoke[gpu]' on the GPU host, or unset RLSMOKE_KDA")  # fmt: skip
    return asked or ("fla" if can_fla else "reference")


def install(path: str) -> None:
    """Bind the KDA functions transformers' layer calls to `path`'s implementation (a process-wide choice)."""
    if not path:
        return
    if path == "fla":
        if not CONFIGS:
            CONFIGS.update(_configs())
    modeling = importlib.import_module(MODELING)
    for name, fla_name in KERNELS.items():
        kernel = _REFERENCE.setdefault(name, inspect.unwrap(getattr(modeling, name)))
        if path == "fla":
            kernel = _fla_call(getattr(importlib.import_module("fla.ops.kda"), fla_name), kernel)
        if name == "recurrent_kimi_delta_attention":
            _DECODE["kernel"], kernel = kernel, _decode_call(kernel)
        setattr(modeling, name, kernel)


@torch.library.custom_op("rlsmoke::kda_decode_step", mutates_args=())
def decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of KDA over the recurrent state, with the bound kernel, as one op that torch.compile keeps
    whole: fla's kernel is `torch.compiler.disable`d, which would cut a captured decode step at every KDA
    layer into graphs and eager calls. Contiguous inputs; both kernels return new tensors, as an op must."""
    q, k, v, g, beta, state = (t.contiguous() for t in (q, k, v, g, beta, state))
    kwargs = {"g": g, "beta": beta, "initial_state": state, "output_final_state": True}
    out, final = _DECODE["kernel"](q, k, v, use_qk_l2norm_in_kernel=True, **kwargs)
    return out.to(v.dtype).contiguous(), final.to(torch.float32).contiguous()


@decode_step.register_fake
def _(q, k, v, g, beta, state):
    contiguous = torch.contiguous_format
    return torch.empty_like(v, memory_format=contiguous), torch.empty_like(
        state, dtype=torch.float32, memory_format=contiguous
    )


def _decode_call(kernel):
    """The layer's recurrent call: a decode step (a state in, the next state out, no grad) goes through
    `decode_step`, anything else to `kernel` as before."""

    def call(query, key, value, g, beta, initial_state=None, output_final_state=False, **kwargs):
        one_step = initial_state is not None and output_final_state and kwargs.get("cu_seqlens") is None
        if one_step and kwargs.get("use_qk_l2norm_in_kernel") and not torch.is_grad_enabled():
            return decode_step(query, key, value, g, beta, initial_state)
        kwargs.update(g=g, beta=beta, initial_state=initial_state, output_final_state=output_final_state)
        return kernel(query, key, value, **kwargs)

    call.__name__, call.__doc__ = getattr(kernel, "__name__", "recurrent"), kernel.__doc__
    return call


def _configs() -> dict:
    """Shipped kernel configs for this GPU; RLSMOKE_FLA_RECORD=DIR records the autotuner's choices."""
    name = torch.cuda.get_device_name(0)
    if record := os.environ.get("RLSMOKE_FLA_RECORD"):
        provenance = {"gpu": name, "fla": fla_configs.fla_version(), "torch": torch.__version__,
                      "command": os.environ.get("RLSMOKE_FLA_RECORD_COMMAND", ""), "date": time.strftime("%Y-%m-%d"),
                      "shapes": "each entry's autotune_key: the kernel's tuning arguments and dtypes"}  # fmt: skip
        atexit.register(fla_configs.record, Path(record) / fla_configs.gpu_folder(name), provenance)
    return fla_configs.use(name)


def _generate_two(model, rows: int, length: int) -> None:
    """Two greedy tokens for `rows` rows, every other left-padded, as the rollout engine calls generate."""
    device = next(model.parameters()).device
    pad = getattr(model.generation_config, "pad_token_id", None) or 0
    vocab = model.get_input_embeddings().num_embeddings
    tokens = torch.randint(1, max(2, vocab), (rows, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(rows, length, dtype=torch.long)
    mask[1::2, :3] = 0
    tokens[mask == 0] = pad
    with torch.no_grad():
        model.generate(tokens.to(device), attention_mask=mask.to(device), do_sample=False, max_new_tokens=2,
                       min_new_tokens=2, pad_token_id=pad, eos_token_id=None, use_cache=True)  # fmt: skip


def _fla_call(kernel, reference):
    def call(query, key, value, *args, **kwargs):
        return kernel(query, key, value, *args, **{k: v for k, v in kwargs.items() if k in FLA_KWARGS})

    call.__name__ = reference.__name__
    call.__doc__ = f"fla.ops.kda.{kernel.__name__} in place of the reference"
    return call


def warm_up(models, *, tokens: tuple[int, ...] = (80, 96)) -> float:
    """Compile and autotune fla's kernels before the first seed, at each model's rows (autotune keys hold
    the batch size); the rollout model also generates, for the prefill and decode variants. Seconds."""
    start = time.perf_counter()
    modeling = importlib.import_module(MODELING)
    for model, with_grad, rows in models:
        layer = next((m for m in model.modules() if type(m).__name__.endswith("LinearAttention")), None)
        if layer is None:
            continue
        weight = layer.q_proj.weight
        for length in tokens:
            x = torch.randn(rows, length, layer.hidden_size, device=weight.device, dtype=weight.dtype)
            with torch.set_grad_enabled(with_grad):
                out = layer(x.requires_grad_(with_grad))
                if with_grad:
                    out.float().sum().backward()
        with torch.no_grad():
            heads, dim = layer.num_heads, layer.head_dim
            one = x[:, :1].detach()
            q = layer.q_proj(one).view(rows, 1, heads, dim)
            g, beta = layer.forget_gate(one), torch.sigmoid(layer.b_proj(one))
            state = torch.zeros(rows, heads, dim, dim, device=weight.device, dtype=torch.float32)
            modeling.recurrent_kimi_delta_attention(q, q, q, g=g, beta=beta, initial_state=state,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)  # fmt: skip
        layer.zero_grad(set_to_none=True)
        if not with_grad:
            for length in tokens:
                _generate_two(model, rows, length)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start
