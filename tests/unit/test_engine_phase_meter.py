"""The per-phase memory meter charges each move to the phase that uses what moved.

A GPU run reports `peak_gib_per_rank_by_phase` from the meter's windows. The move that brings the
train weights back for scoring happens between the rollout and the train phase; charged to the
rollout window, it made the rollout phase read as the master weights plus the compute copy
(32.1 GiB for GLM-5 4-layer-1gpu on an H200) where the rollout engine holds a third of that.

What CPU can show: which window each real move of the one-device placement happens in (the meter's
phase at the time of the move). The device bytes themselves are the GPU run's.
"""

import torch

from rlsmoke.engine import grpo
from rlsmoke.engine.config import RunConfig
from rlsmoke.engine.data import encode, read_prompts

CASE = "glm5-744b-a40b-4layer"
# The parts each phase works with on the device; a move onto the device belongs to one of these.
USES = {"rollout": {"rollout_copy"}, "train": {"train_params", "optimizer_state"},
        "sync": {"train_params", "rollout_copy"}}  # fmt: skip


def test_arrivals_count_in_the_phase_that_uses_them():
    from rlsmoke.engine.model import (  # transformers: at run time, not collection
        checkpoint_dir,
        load_tokenizer,
    )
    from rlsmoke.engine.placement import open_workers

    cfg = RunConfig(
        case=CASE, tiny=True, num_gpus=1, n_prompts=2, n_samples=2, max_response_len=4, offload=True
    )
    ckpt = checkpoint_dir(CASE, tiny=True)
    tok = load_tokenizer(ckpt)
    prompts = [encode(tok, p) for p in read_prompts(cfg.prompt_data, cfg.n_prompts, 0)]
    workers = open_workers(cfg, ckpt, tok.eos_token_id, tok.pad_token_id or tok.eos_token_id)
    phases = workers.phases
    moves = []  # (the meter's window, part, where to)
    real_move = phases._move

    def observed(part, where, asked_by):
        moves.append((phases.meter.phase, part, where))
        return real_move(part, where, asked_by)

    phases._move = observed
    try:
        groups = workers.generate([p.ids for p in prompts], cfg.n_samples, seed=0)
        for g in groups:
            g.rewards = torch.arange(cfg.n_samples, dtype=torch.float32)
        old = workers.forward_only(groups)
        adv = list(grpo.group_advantages(torch.stack([g.rewards for g in groups])))
        workers.step(groups, [lp for lp, _ in old], adv)
        workers.sync(skip=False)
        workers.generate([p.ids for p in prompts], cfg.n_samples, seed=1)
        workers.forward_only(groups)
    finally:
        workers.close()

    arrivals = [(window, part) for window, part, where in moves if where == "device"]
    # the walk brings the train weights back twice (score after each rollout) and the rollout copy once
    assert [part for _, part in arrivals].count("train_params") == 2
    assert ("train", "train_params") in arrivals and ("sync", "rollout_copy") in arrivals
    for window, part in arrivals:
        assert part in USES[window], f"{part} arrives on the device inside the {window} phase's window"
    # departures only free memory; they close the window of the phase that was using the part
    departures = [(window, part) for window, part, where in moves if where == "host"]
    assert ("train", "rollout_copy") not in departures and ("sync", "train_params") in departures
