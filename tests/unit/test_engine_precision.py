"""Train-vs-rollout agreement on CPU: DSA past 64 tokens, the trainer's cast path, the log-prob slope.

A case: tiny GLM-5, freshly synthesized. Runs: a KV-cache rollout and the trainer's full forward over
its samples. Gates: the two agree where they compute the same thing, and the slope sees a temperature.
"""

import json
import shutil

import pytest
import torch

from rlsmoke.checkpoints import prepare
from rlsmoke.cli import main
from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.grpo import logprob_slope
from rlsmoke.errors import ExitCode
from rlsmoke.models import model_spec
from rlsmoke.shipped import FIXTURES

CASE = "glm5-744b-a40b-4layer"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rlsmoke.engine.model import load_tokenizer  # transformers: at run time, not collection

    ckpt = prepare(CASE, tiny=True, cache_dir=tmp_path_factory.mktemp("cache"))
    tokenizer = load_tokenizer(ckpt)
    prompts = [encode(tokenizer, p).ids for p in read_prompts(FIXTURES / "data" / "math.jsonl", 2, 0)]
    return ckpt, model_spec(CASE, tiny=True), prompts


def _rollout(model, prompts, max_new, n=2):
    from rlsmoke.engine.rollout import RolloutEngine

    engine = RolloutEngine(model, temperature=1.0, max_new_tokens=max_new, eos_id=-1, pad_id=0)
    return engine.generate(prompts, n, seed=0)


def _trainer(master, **kw):
    from rlsmoke.engine.train import Trainer

    return Trainer(master, lr=1e-6, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0, eps_clip=0.2,
                   eps_clip_high=0.28, **kw)  # fmt: skip


def test_dsa_decode_matches_the_full_forward_past_64_tokens(tiny):
    from rlsmoke.engine.model import load_policy

    ckpt, spec, prompts = tiny
    model = load_policy(ckpt, spec, "float32", "cpu")
    groups = _rollout(model, prompts, 60)  # prompts of 27 and 39 tokens: sequences reach 99
    assert max(g.tokens.shape[1] for g in groups) > 64
    trained = _trainer(model).forward_only(groups)
    worst = max(
        (lp - g.rollout_logprobs).abs().max().item() for g, (lp, _) in zip(groups, trained, strict=True)
    )
    assert worst < 1e-4, f"decode and full forward differ by {worst} nats on a token"


def test_a_checkpoint_whose_index_topk_is_shorter_than_the_run_is_refused(tiny, tmp_path, capsys):

    ckpt, _, _ = tiny
    stale = shutil.copytree(ckpt, tmp_path / "stale")
    config = json.loads((stale / "config.json").read_text())
    (stale / "config.json").write_text(json.dumps(config | {"index_topk": 64}))
    rc = main(["run", CASE, "--platform", "cpu", "--checkpoint", str(stale), "--max-response-len", "60",
               "--out", str(tmp_path / "out")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == ExitCode.USAGE
    # the checkpoint's own index_topk, not the case's, bounds the run: refused before torch loads
    assert len(err) == 1 and err[0].startswith("error: [run.context]") and "index_topk=64" in err[0], err


def test_the_trainer_on_bf16_params_computes_what_the_bf16_rollout_computed(tiny):
    from rlsmoke.engine.model import load_policy

    ckpt, spec, prompts = tiny
    rollout = load_policy(ckpt, spec, "bfloat16", "cpu")
    groups = _rollout(rollout, prompts, 16, n=8)
    master = load_policy(ckpt, spec, "float32", "cpu")
    params = _trainer(master, compute_model=load_policy(ckpt, spec, "bfloat16", "cpu"))
    autocast = _trainer(load_policy(ckpt, spec, "float32", "cpu"), compute_dtype=torch.bfloat16)

    def abs_diff(trainer):
        return max((lp - g.rollout_logprobs).abs().mean().item()
                   for g, (lp, _) in zip(groups, trainer.forward_only(groups), strict=True))  # fmt: skip

    same, other = abs_diff(params), abs_diff(autocast)
    # the same weights and dtypes leave only kernel order (decode against the full forward: 0 with
    # transformers 5.17, 0.0025 with 5.24); autocast keeps an fp32 residual stream and computes the
    # router in bf16, a different network (0.08 with both)
    assert same < 5e-3 and other > 10 * same, (same, other)


def test_a_bf16_params_step_updates_the_fp32_main_weights_and_rounds_them_into_the_copy(tiny):
    from rlsmoke.engine.model import load_policy

    ckpt, spec, prompts = tiny
    master = load_policy(ckpt, spec, "float32", "cpu")
    compute = load_policy(ckpt, spec, "bfloat16", "cpu")
    trainer = _trainer(master, compute_model=compute)
    groups = _rollout(compute, prompts, 8)
    old = [lp for lp, _ in trainer.forward_only(groups)]
    advantages = [torch.tensor([1.0, -1.0]) for _ in groups]
    metrics = trainer.step(groups, old, advantages)
    assert metrics["train/updated_params_frac"] > 0.5 and metrics["train/grad_norm"] > 0
    mains = dict(master.named_parameters())
    for name, p in compute.named_parameters():
        assert p.grad is None, f"{name} kept its bf16 grad"
        assert torch.equal(p, mains[name].detach().to(p.dtype)), f"{name} is not the rounded main weight"


def test_the_slope_sees_a_temperature_and_not_noise():
    g = torch.Generator().manual_seed(0)
    logits = 8 * torch.randn(4096, 512, generator=g)  # 4096 positions, the synthesized checkpoints' scale
    tokens = torch.multinomial(torch.softmax(logits / 0.8, -1), 1, generator=g)
    at = {t: torch.log_softmax(logits / t, -1).gather(-1, tokens)[:, 0] for t in (1.0, 0.8)}
    mask = torch.ones(4096)
    noise = 0.1 * torch.randn(4096, generator=g)  # a bf16-like floor: mean abs diff 0.08
    assert logprob_slope(at[1.0], at[0.8], mask) < -0.1  # the rollout tempered, the trainer not
    assert abs(logprob_slope(at[0.8] + noise, at[0.8], mask)) < 0.01
    assert abs(logprob_slope(at[0.8], at[0.8], mask)) == 0
