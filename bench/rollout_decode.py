"""The rollout's decode paths on one device: `generate` against the static decode (engine.decode), through
the rollout engine as a run calls it (its batch for the device, each group's own generator).

    python bench/rollout_decode.py glm5-744b-a40b-4layer-1gpu [--device cuda] [--seeds 3]
        [--decodes generate,static-eager,static]   (static-eager: the static decode, its step not captured)

Per path, one line per call: seconds and decoded tokens/s (rows x response columns, as
bench/rollout_shapes.py counts them). The static path's first call holds the compile (read from
TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR when they hold it: bench/gpu_rollout_decode.sh runs this twice
to show both). Then how the two paths agree, seed by seed: the groups sampled the same tokens, and the
largest log-prob gap over those; and dynamo's graph breaks and inductor's CUDA-graph skips, which keep
the step's launches.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlsmoke.engine import kda
from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.grpo import train_rollout_stats
from rlsmoke.engine.model import checkpoint_dir, load_policy, load_tokenizer
from rlsmoke.engine.rollout import RolloutEngine, batch_for
from rlsmoke.engine.train import token_logprobs
from rlsmoke.models import model_spec
from rlsmoke.shipped import FIXTURES


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def calls(engine, prompts, n: int, seeds: int, device: str, label: str) -> list:
    out = []
    for seed in range(seeds):
        _sync(device)
        start = time.perf_counter()
        groups = engine.generate(prompts, n, seed)
        _sync(device)
        seconds = time.perf_counter() - start
        decoded = sum(g.mask.numel() for g in groups)
        note = " (compile included)" if seed == 0 and getattr(engine.static, "compiled", False) else ""
        print(
            f"{label:9s} seed {seed}: {seconds:7.2f} s  {decoded / seconds:8.0f} tokens/s{note}", flush=True
        )
        out.append(groups)
    return out


def agreement(expected: list, got: list) -> str:
    """How far the two paths sample alike: per sample, the tokens before the first that differs (once one
    differs, the two continue from different text), and the largest log-prob gap over those tokens."""
    same, total, gap, whole = 0, 0, 0.0, 0
    for a, b in zip(expected, got, strict=True):
        ra, rb = a.response, b.response
        width = min(ra.shape[1], rb.shape[1])
        differs = (ra[:, :width] != rb[:, :width]).int()
        prefix = torch.where(differs.any(1), differs.argmax(1), torch.full_like(differs[:, 0], width))
        for row, n in enumerate(prefix.tolist()):
            live = int(min(a.mask[row, :width].sum().item(), b.mask[row, :width].sum().item()))
            n = min(n, live)
            same, total, whole = same + n, total + live, whole + (n == live)
            if n:
                gap = max(gap, (a.rollout_logprobs[row, :n] - b.rollout_logprobs[row, :n]).abs().max().item())
    samples = sum(g.tokens.shape[0] for g in expected)
    return (
        f"{whole}/{samples} samples the same tokens throughout; {same}/{total} tokens before the first that "
        f"differs; log-probs within {gap:.2e} over those"
    )


@torch.no_grad()
def forward_gap(model, groups: list, temperature: float) -> str:
    """The gate's own metrics against each path: the trainer's log-probs of the sampled tokens (one full
    forward of the same model, engine.train.token_logprobs) against the rollout's, as grpo.train_rollout_stats
    reduces them; the per-sample mean weighted by each group's samples, as one batch would give it."""
    stats = []
    for g in groups:
        train_lp = token_logprobs(model, g, temperature)[0].cpu()
        stats.append((len(g.tokens), train_rollout_stats(train_lp, g.rollout_logprobs, g.mask)))
    samples = sum(n for n, _ in stats)
    mean = sum(n * st["train/train_rollout_logprob_abs_diff"] for n, st in stats) / samples
    worst = max(st["train/train_rollout_logprob_abs_diff_max"] for _, st in stats)
    return f"abs_diff {mean:.4f}, abs_diff_max {worst:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--decodes", default="generate,static")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on CPU")
    args = ap.parse_args()
    spec = model_spec(args.case, tiny=args.tiny)
    ckpt = checkpoint_dir(args.case, tiny=args.tiny)
    tok = load_tokenizer(ckpt)
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    prompts = [encode(tok, p).ids for p in read_prompts(FIXTURES / "data" / "math.jsonl", args.prompts, 0)]
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    t0 = time.perf_counter()
    model = load_policy(ckpt, spec, dtype, args.device)
    batch = batch_for("auto", args.device, spec.family, kda.choose(args.device, spec.family))
    print(f"{args.case} on {torch.cuda.get_device_name(0) if args.device.startswith('cuda') else 'CPU'}: load "
          f"{time.perf_counter() - t0:.1f} s, {dtype}, batch {batch}, {len(prompts)} prompts x {args.samples}, "
          f"{args.tokens} tokens, torch {torch.__version__}", flush=True)  # fmt: skip
    results = {}
    for label in args.decodes.split(","):
        engine = RolloutEngine(model, temperature=args.temperature, max_new_tokens=args.tokens, eos_id=eos,
                               pad_id=pad, batch=batch, decode=label.removesuffix("-eager"))  # fmt: skip
        if label == "static-eager" and engine.static is not None:  # the same decode, its step not captured
            engine.static.compiled, engine.static.step = False, engine.static._forward
        if engine.fallback:
            print(f"{label}: falls back to generate: {engine.fallback}", flush=True)
        results[label] = calls(engine, prompts, args.samples, args.seeds, args.device, label)
        if engine.fallback:
            print(f"{label}: ran as generate: {engine.fallback}", flush=True)
    for label, runs in results.items():
        for seed, groups in enumerate(runs):
            gap = forward_gap(model, groups, args.temperature)
            print(f"log-prob gap to a full forward, {label} seed {seed}: {gap}", flush=True)
    for label in [k for k in results if k != "generate" and "generate" in results]:
        for seed, (a, b) in enumerate(zip(results["generate"], results[label], strict=True)):
            print(f"agreement with generate, {label} seed {seed}: {agreement(a, b)}", flush=True)
    counters = torch._dynamo.utils.counters
    breaks = sum(counters["graph_break"].values())
    skips = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    print(
        f"dynamo graph breaks {breaks} ({len(counters['graph_break'])} kinds); inductor {skips or 'no cudagraph counters'}"
    )
    for reason, count in list(counters["graph_break"].items())[:10]:
        print(f"  break x{count}: {reason[:160]}")


if __name__ == "__main__":
    main()
