"""The megatron trainer's routed experts, grouped against megatron-core's `SequentialMLP` loop, in one run:
a forward without grad and a forward with backward, each timed (host until the launches return, and wall
to the device's end), and how far apart their outputs and gradients land on this device.

    python bench/megatron_experts.py glm5-744b-a40b-4layer-1gpu --device cuda [--tokens 1200] [--trials 10]
    python bench/megatron_experts.py glm5-744b-a40b-4layer-1gpu --tiny  # on a CPU

The case's MoE layer at its width (GLM-5 4-layer 1-GPU: 64 experts of 2048, hidden 6144, top-8), its
weights random, `--tokens` tokens routed top-k at random, in the trainer's compute dtype (bf16 on a GPU).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="the tiny width (a CPU cannot hold the full one)")
    ap.add_argument("--tokens", type=int, default=1200)
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()

    from megatron.core.transformer.moe.experts import SequentialMLP

    from rlsmoke.bridge.convert import Parallel
    from rlsmoke.engine.megatron.dist import close, init
    from rlsmoke.engine.megatron.experts import why_sequential
    from rlsmoke.engine.megatron.model import build_gpt
    from rlsmoke.models import model_spec

    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    init(0, Parallel(), backend="nccl" if cuda else "gloo")
    spec = model_spec(args.case, tiny=args.tiny)
    gpt = build_gpt(spec, Parallel(), params_dtype=dtype, device=args.device)
    [experts] = [m for m in gpt.modules() if isinstance(m, SequentialMLP)]
    gen = torch.Generator(device=args.device).manual_seed(0)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.02, generator=gen)
    n, k = experts.num_local_experts, gpt.config.moe_router_topk
    routed = torch.rand(args.tokens, n, generator=gen, device=args.device).topk(k).indices.flatten()
    counts = torch.bincount(routed, minlength=n)
    rows = int(counts.sum())
    x = torch.randn(rows, gpt.config.hidden_size, generator=gen, device=args.device, dtype=dtype)
    probs = torch.rand(rows, generator=gen, device=args.device)
    grad_out = torch.randn_like(x)
    impls = {"grouped": type(experts).forward, "sequential": SequentialMLP.forward}
    print(f"{args.case}: {n} experts, top-{k}, {args.tokens} tokens ({rows} rows), {dtype}, {args.device}; "
          f"grouped path: {why_sequential(experts.config, x, experts.local_experts[0]) or 'taken'}")  # fmt: skip

    def forward(impl, train: bool):
        xi, pi = x.clone().requires_grad_(train), probs.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            out, _ = impls[impl](experts, xi, counts, pi)
        if train:
            experts.zero_grad(set_to_none=True)
            out.backward(grad_out)
        return out, xi, pi

    def sync():
        if cuda:
            torch.cuda.synchronize()

    results = {}
    for impl in impls:
        for train in (False, True):
            for _ in range(3):
                forward(impl, train)
            sync()
            host = wall = 0.0
            for _ in range(args.trials):
                t0 = time.perf_counter()
                forward(impl, train)
                host += time.perf_counter() - t0
                sync()
                wall += time.perf_counter() - t0
            results[impl, train] = (host / args.trials, wall / args.trials)
            print(f"{impl:>10} {'forward+backward' if train else 'forward, no grad':>16}: host {1e3 * host / args.trials:7.2f} ms, "
                  f"wall {1e3 * wall / args.trials:7.2f} ms")  # fmt: skip
    for train in (False, True):
        ratio = results["sequential", train][1] / results["grouped", train][1]
        print(f"sequential / grouped wall, {'forward+backward' if train else 'forward'}: {ratio:.2f}x")

    got = {}
    for impl in impls:
        out, xi, pi = forward(impl, True)
        got[impl] = {"output": out.detach(), "input grad": xi.grad, "probs grad": pi.grad,
                     **{name: p.grad.clone() for name, p in experts.named_parameters()}}  # fmt: skip
    for what in ("output", "input grad", "probs grad", "weights' grads"):
        pairs = [(a, got["sequential"][name]) for name, a in got["grouped"].items()
                 if name == what or (what == "weights' grads" and "." in name)]  # fmt: skip
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
        scale = max(float(b.float().abs().max()) for _, b in pairs)
        equal = all(torch.equal(a, b) for a, b in pairs)
        print(
            f"{what}: bit-equal {equal}, max |grouped - sequential| {diff:.3g} (max |sequential| {scale:.3g})"
        )
    close()


if __name__ == "__main__":
    main()
