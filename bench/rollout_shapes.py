"""The rollout's shapes on one device: per-group `generate` calls against one call per rank, with the
experts' decode kernel transformers picks (batched_mm on a GPU) or grouped_mm kept.

    python bench/rollout_shapes.py glm5-744b-a40b-4layer-1gpu --device cuda [--prompts 8 --samples 8 --tokens 100]

Prints one line per option: seconds per rollout (the best of --trials after a warm-up call), decode
ms per step, generated tokens/s. Sampling is seeded, so each option's tokens are comparable run to run.
"""

from __future__ import annotations

import argparse
import time

import torch

from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.model import checkpoint_dir, load_policy, load_tokenizer
from rlsmoke.engine.rollout import keep_grouped_experts
from rlsmoke.models import model_spec
from rlsmoke.shipped import FIXTURES


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def per_group(model, prompts, n, tokens, eos, pad):
    out = 0
    for i, ids in enumerate(prompts):
        torch.manual_seed(i)
        x = torch.tensor([ids] * n, device=model.device)
        y = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, top_k=0, top_p=1.0,
                           max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=eos, pad_token_id=pad)  # fmt: skip
        out += (y.shape[1] - x.shape[1]) * n
    return out


def one_call(model, prompts, n, tokens, eos, pad):
    """Every group in one left-padded batch."""
    width = max(len(p) for p in prompts)
    rows, mask = [], []
    for ids in prompts:
        for _ in range(n):
            rows.append([pad] * (width - len(ids)) + list(ids))
            mask.append([0] * (width - len(ids)) + [1] * len(ids))
    x = torch.tensor(rows, device=model.device)
    torch.manual_seed(0)
    y = model.generate(x, attention_mask=torch.tensor(mask, device=model.device), do_sample=True, top_k=0,
                       top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=eos, pad_token_id=pad)  # fmt: skip
    return (y.shape[1] - x.shape[1]) * len(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--options", default="per_group,per_group+grouped_mm,one_call,one_call+grouped_mm")
    args = ap.parse_args()
    spec = model_spec(args.case, tiny=args.tiny)
    ckpt = checkpoint_dir(args.case, tiny=args.tiny)
    tok = load_tokenizer(ckpt)
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    prompts = [encode(tok, p).ids for p in read_prompts(FIXTURES / "data" / "math.jsonl", args.prompts, 0)]
    t0 = time.perf_counter()
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    model = load_policy(ckpt, spec, dtype, args.device)
    print(
        f"load {time.perf_counter() - t0:.1f} s; prompt lengths {sorted(len(p) for p in prompts)}; "
        f"experts {getattr(model, 'get_experts_implementation', lambda: '?')()}",
        flush=True,
    )
    decode_switch = getattr(model, "_optimize_model_for_decode", None)
    for option in args.options.split(","):
        shape, _, kernel = option.partition("+")
        if kernel == "grouped_mm":
            keep_grouped_experts(model)
        elif decode_switch is not None:
            model._optimize_model_for_decode = decode_switch
        fn = {"per_group": per_group, "one_call": one_call}[shape]
        times = []
        with torch.no_grad():
            for _ in range(args.trials + 1):  # the first call pays first-use kernels
                _sync(args.device)
                start = time.perf_counter()
                generated = fn(model, prompts, args.samples, args.tokens, eos, pad)
                _sync(args.device)
                times.append(time.perf_counter() - start)
        best = min(times[1:])
        steps = args.tokens * (len(prompts) if shape == "per_group" else 1)
        print(
            f"{option:24s} first {times[0]:6.2f} s  best {best:6.2f} s  {1000 * best / steps:6.1f} ms/step  "
            f"{generated / best:8.0f} tokens/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
