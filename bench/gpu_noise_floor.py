"""What sets the bf16 train-vs-rollout noise floor on a GPU case, candidate by candidate.

One process loads the case's checkpoint once: a bf16 rollout copy and an fp32 master copy. For each
seed and candidate it samples seed 004's per-rollout shape (8 prompts x 8 samples, up to 100 tokens)
with the engine's own sampling path, at temperature 1 and at 0.8, and scores the same samples with
the trainer's forward. At 0.8 it reports three statistics over the same samples:

- clean: trainer and rollout both apply the temperature (Miles' convention: the trainer divides the
  logits by the rollout temperature, the engine records log-probs of the tempered distribution);
- clean-at-1: both report temperature-1 log-probs (the convention before it);
- mismatch: the rollout applies the temperature and the trainer does not (the fault twin).

Candidates (rollout side, trainer side):
- autocast: bf16 rollout; fp32 master weights under bf16 autocast (the engine's GPU default before);
- bf16-params: bf16 rollout; the trainer forward on the same bf16 weights (Megatron's bf16 params
  over fp32 main params): the identical cast path;
- sdpa-math: bf16-params with SDPA's math backend in both the KV-cache decode and the full forward;
- fp32-lm-head: bf16-params with the output projection computed in fp32 on both sides;
- logit-std-4: bf16-params with the output projection halved on both sides, as if synthesized with
  LOGIT_STD 4 instead of 8 (a power of two: the bf16 weights halve exactly).

Each statistic is also given at seed 000's old shape (2 prompts x 4 samples x the first 16 tokens),
cut from the same samples, to see what tokens per verdict buy.

    python bench/gpu_noise_floor.py OUT_DIR [--seeds 3] [--deadline-s 420]

Writes OUT_DIR/noise_floor.jsonl (one line per seed x candidate x temperature, as it goes) and
OUT_DIR/noise_floor.md (the table). Needs a CUDA GPU; `--device cpu --tiny` runs the same code on CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LogitsProcessorList

from rlsmoke.engine import grpo
from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.grpo import logprob_slope
from rlsmoke.engine.model import checkpoint_dir, load_policy, load_tokenizer
from rlsmoke.engine.rollout import LogprobRecorder, response_mask
from rlsmoke.models import model_spec
from rlsmoke.recipe import SEED_RECIPE
from rlsmoke.shipped import FIXTURES

CANDIDATES = ("autocast", "bf16-params", "sdpa-math", "fp32-lm-head", "logit-std-4")
ROLLOUT_SIDES = (
    "bf16-params",
    "sdpa-math",
    "fp32-lm-head",
    "logit-std-4",
)  # autocast shares bf16-params' samples
SHAPES = {"8x8x100": (8, 8, 100), "2x8x100": (2, 8, 100), "8x8x32": (8, 8, 32), "2x4x16": (2, 4, 16)}


def sample(model, ids, n, temperature, seed, max_new):
    """The engine's sampling call, recording log-probs at temperature 1 and at `temperature`."""
    torch.manual_seed(seed)
    prompt = torch.tensor([ids] * n, device=model.device)
    at_1, at_t = LogprobRecorder(1.0), LogprobRecorder(temperature)
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=temperature, top_k=0,
        top_p=1.0, max_new_tokens=max_new, min_new_tokens=1, logits_processor=LogitsProcessorList([at_1, at_t]),
        eos_token_id=1, pad_token_id=1, use_cache=True,
    )  # fmt: skip
    response = out[:, len(ids) :]
    return out, at_1.finish(response[:, -1]), at_t.finish(response[:, -1]), response_mask(response, 1)


@torch.no_grad()
def score(model, tokens, prompt_len, temperature, autocast):
    ctx = torch.autocast(model.device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids=tokens, use_cache=False).logits[:, prompt_len - 1 : -1].float()
    target = tokens[:, prompt_len:, None]
    at_1 = torch.log_softmax(logits, -1).gather(-1, target)[..., 0]
    at_t = torch.log_softmax(logits / temperature, -1).gather(-1, target)[..., 0]
    return at_1, at_t


def stats(pairs, n_prompts, n_samples, max_len):
    """Mean diff, abs diff, KL over the first n_prompts groups, n_samples samples, max_len tokens."""
    md, ad, kl = [], [], []
    cut = [
        (t[:n_samples, :max_len], r[:n_samples, :max_len], m[:n_samples, :max_len])
        for t, r, m in pairs[:n_prompts]
    ]
    # the slope over every token of the batch at once, as the engine gates it
    slope = logprob_slope(*(torch.cat([c[i].flatten() for c in cut]) for i in range(3))).item()
    for train, rollout, mask in cut:
        md.append((grpo.sample_mean(train, mask) - grpo.sample_mean(rollout, mask)).item())
        s = grpo.train_rollout_stats(train, rollout, mask)
        ad.append(s["train/train_rollout_logprob_abs_diff"])
        kl.append(s["train/train_rollout_kl"])
    return {
        "mean_diff": statistics.mean(md),
        "abs_diff": statistics.mean(ad),
        "kl": statistics.mean(kl),
        "slope": slope,
    }


@contextlib.contextmanager
def candidate(name, rollout, master):
    """Set up a candidate on both models, undo it afterwards."""
    heads = [m.lm_head for m in (rollout, master)]
    saved = [h.forward for h in heads]
    weights = [h.weight.data.clone() for h in heads] if name == "logit-std-4" else None
    stack = contextlib.ExitStack()
    if name == "sdpa-math":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    if name == "fp32-lm-head":
        for h in heads:
            h.forward = lambda x, h=h: F.linear(x.float(), h.weight.float())
    if name == "logit-std-4":
        for h in heads:
            h.weight.data.mul_(0.5)
    try:
        with stack:
            yield
    finally:
        for h, f in zip(heads, saved, strict=True):
            h.forward = f
        if weights:
            for h, w in zip(heads, weights, strict=True):
                h.weight.data.copy_(w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--case", default="glm5-744b-a40b-4layer-1gpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--candidates", default=",".join(ROLLOUT_SIDES), help="rollout-side candidates")
    ap.add_argument("--temperatures", default="1.0,0.8")
    ap.add_argument("--n-prompts", type=int, default=SEED_RECIPE.rollout_batch_size)
    ap.add_argument("--n-samples", type=int, default=SEED_RECIPE.n_samples_per_prompt)
    ap.add_argument("--max-response-len", type=int, default=SEED_RECIPE.rollout_max_response_len)
    ap.add_argument("--deadline-s", type=float, default=420.0)
    args = ap.parse_args()
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = args.out / "noise_floor.jsonl"
    env = {
        "torch": torch.__version__,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "fp32_precision": torch.get_float32_matmul_precision(),
    }
    import transformers

    env["transformers"] = transformers.__version__
    transformers.logging.set_verbosity_error()
    spec = model_spec(args.case, tiny=args.tiny)
    ckpt = checkpoint_dir(args.case, tiny=args.tiny)
    env["prepare_s"] = round(time.perf_counter() - t_start, 1)
    tok = load_tokenizer(ckpt)
    rollout = load_policy(ckpt, spec, "bfloat16", args.device)
    master = load_policy(ckpt, spec, "float32", args.device)
    env["load_s"] = round(time.perf_counter() - t_start, 1)
    (args.out / "env.json").write_text(json.dumps(env, indent=2))
    print(env, flush=True)
    temps = [float(t) for t in args.temperatures.split(",")]
    rows = []
    for seed in range(args.seeds):
        prompts = [
            encode(tok, p) for p in read_prompts(FIXTURES / "data" / "math.jsonl", args.n_prompts, seed)
        ]
        for side in args.candidates.split(","):
            for temperature in temps:
                if time.perf_counter() - t_start > args.deadline_s:
                    print("deadline reached", flush=True)
                    return finish(args.out, rows, env)
                t0 = time.perf_counter()
                with candidate(side, rollout, master):
                    groups = [sample(rollout, p.ids, args.n_samples, temperature, seed * 1000 + i,
                                     args.max_response_len) for i, p in enumerate(prompts)]  # fmt: skip
                    t_gen = time.perf_counter() - t0
                    trainers = ["bf16-params", "autocast"] if side == "bf16-params" else [side]
                    scored = {name: [score(master if name == "autocast" else rollout, tokens, len(p.ids), temperature,
                                           name == "autocast")
                                     for (tokens, *_), p in zip(groups, prompts, strict=True)]
                              for name in trainers}  # fmt: skip
                for name, sc in scored.items():
                    row = {"seed": seed, "candidate": name, "temperature": temperature, "generate_s": round(t_gen, 2),
                           "score_s": round(time.perf_counter() - t0 - t_gen, 2)}  # fmt: skip
                    pick = {
                        "clean": [(tt, rt, m) for (_, _, rt, m), (_, tt) in zip(groups, sc, strict=True)],
                        "clean-at-1": [
                            (t1, r1, m) for (_, r1, _, m), (t1, _) in zip(groups, sc, strict=True)
                        ],
                        "mismatch": [(t1, rt, m) for (_, _, rt, m), (t1, _) in zip(groups, sc, strict=True)],
                    }
                    for kind, pairs in pick.items():
                        if temperature == 1.0 and kind != "clean":
                            continue
                        pairs = [tuple(x.float().cpu() for x in p) for p in pairs]
                        for shape, (n_p, n_s, n_t) in SHAPES.items():
                            row[f"{shape}|{kind}"] = stats(pairs, n_p, n_s, n_t)
                    rows.append(row)
                    with lines.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)
    finish(args.out, rows, env)


def finish(out: Path, rows: list[dict], env: dict) -> None:
    """noise_floor.md: per candidate and temperature, each statistic's range over the seeds."""
    md = [f"# bf16 noise floor ({env.get('torch')}, transformers {env.get('transformers')}, "
          f"TF32 matmul {env.get('tf32_matmul')})", ""]  # fmt: skip
    md += ["| candidate | T | shape | statistic | mean diff (per seed) | slope (per seed) | abs diff (max) | KL (max) "
           "| generate s |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    keys = sorted(
        {k for r in rows for k in r if "|" in k}, key=lambda k: (list(SHAPES).index(k.split("|")[0]), k)
    )
    for name in CANDIDATES:
        for temperature in sorted({r["temperature"] for r in rows}, reverse=True):
            sel = [r for r in rows if r["candidate"] == name and r["temperature"] == temperature]
            if not sel:
                continue
            for key in keys:
                vals = [r[key] for r in sel if key in r]
                if not vals:
                    continue
                shape, kind = key.split("|")
                md.append(
                    f"| {name} | {temperature:g} | {shape} | {kind} | "
                    + " ".join(f"{v['mean_diff']:+.4f}" for v in vals)
                    + " | "
                    + " ".join(f"{v.get('slope', float('nan')):+.3f}" for v in vals)
                    + f" | {max(v['abs_diff'] for v in vals):.4f} | {max(v['kl'] for v in vals):.4f} | "
                    + f"{statistics.mean(r['generate_s'] for r in sel):.1f} |"
                )
    (out / "noise_floor.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)


if __name__ == "__main__":
    main()
