"""The rollout copy's turn on a shared device, parked against freed: `engine.offload.Phases` moving a
bf16 model of `--gib` GiB to the host for the train phase and back for the sync, as a seed does twice,
once with the parameters parked (a stale-weights sync) and once freed (the sync then writes each one).

    python bench/rollout_copy_turns.py --gib 12 [--tensor-mib 240] [--seeds 2] [--device cuda]

Prints each way's seconds per seed: out (train phase), back (sync), and the first seed apart (its host
pages are fresh: they fault in on first touch).
"""

from __future__ import annotations

import argparse
import time

import torch

from rlsmoke.engine.config import Inject, RunConfig
from rlsmoke.engine.offload import Phases


class _NoTrainer:
    """What `Phases` asks of a trainer that stays on the device (offload_train off)."""

    master = torch.nn.ParameterList()
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)


def turns(gib: float, tensor_mib: int, seeds: int, inject: Inject, device: str) -> list[tuple[float, float]]:
    n = int(gib * 1024 / tensor_mib)
    elems = tensor_mib * 2**20 // 2
    model = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(elems, device=device, dtype=torch.bfloat16), requires_grad=False)
         for _ in range(n)]
    )  # fmt: skip
    cfg = RunConfig(
        case="glm4.5-355b-a32b-4layer",
        tiny=False,
        device=device,
        offload=True,
        offload_train=False,
        inject=inject,
    )
    phases = Phases(cfg, device, _NoTrainer(), model)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seconds = []
    for _ in range(seeds):
        sync()
        t0 = time.perf_counter()
        phases._move("rollout_copy", "host", "train")
        t1 = time.perf_counter()
        phases._move("rollout_copy", "device", "sync")
        sync()
        seconds.append((t1 - t0, time.perf_counter() - t1))
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=12.0)
    ap.add_argument("--tensor-mib", type=int, default=240)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"{where}, {args.gib} GiB in {args.tensor_mib} MiB tensors, {args.seeds} turns each")
    for label, inject in (
        ("parked (stale-weights)", Inject("stale-weights")),
        ("freed (a loading sync)", Inject()),
    ):
        for i, (out, back) in enumerate(turns(args.gib, args.tensor_mib, args.seeds, inject, args.device)):
            print(f"{label}: turn {i}: out {out:.2f} s, back {back:.2f} s")


if __name__ == "__main__":
    main()
