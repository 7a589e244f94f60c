"""How often a fork's threads lose torch's inherited thread pool, with and without asking for it first.

After a fork, torch replaces the pool the parent used on the first thread that asks for it; threads that
ask at once (transformers' loader converts a checkpoint's tensors on several) can find none and fail with
"Invalid thread pool!". `engine.procs.renew_thread_pool` asks once, on the fork's one thread, first.

    python bench/fork_pool_race.py [--children 300] [--threads 16]

Prints, for each way, how many children had a thread fail.
"""

from __future__ import annotations

import argparse
import os
import threading

import torch

from rlsmoke.engine.procs import renew_thread_pool


def _child(threads: int, renew: bool) -> int:
    if renew:
        renew_thread_pool()
    start, failed, tensor = threading.Barrier(threads), [], torch.randn(1024, 1024)

    def cast():
        start.wait()
        try:
            tensor.to(torch.bfloat16)
        except RuntimeError:
            failed.append(1)

    workers = [threading.Thread(target=cast) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=300)
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(max(2, os.cpu_count() or 2))
    (torch.randn(2000, 2000) * 2).sum()  # the parent's pool, used: what a fork inherits
    for renew in (False, True):
        lost = 0
        for _ in range(args.children):
            pid = os.fork()
            if pid == 0:
                os._exit(_child(args.threads, renew))
            lost += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        way = "asked first (renew_thread_pool)" if renew else "plain fork"
        print(f"{way}: {lost} of {args.children} children had a thread lose the pool")


if __name__ == "__main__":
    main()
