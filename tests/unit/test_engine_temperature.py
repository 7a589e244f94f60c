"""Miles' temperature convention: the rollout samples at T and both engines report log-probs of
logits / T (SGLang's returned log-probs; Miles' trainer divides the logits by --rollout-temperature).
`--inject temperature-mismatch` leaves the rollout engine's log-probs at T = 1: one side forgets T.

A real tiny checkpoint, a real `generate` and a real trainer forward; the reference log-probs are
computed here from the model's logits.
"""

import pytest

from rlsmoke.engine.config import Inject

CASE = "glm4.5-355b-a32b-4layer"
T = 0.5


@pytest.fixture(scope="module")
def run_at_t():
    import torch

    from rlsmoke.engine.model import checkpoint_dir, load_policy, load_tokenizer
    from rlsmoke.engine.rollout import RolloutEngine
    from rlsmoke.models import model_spec

    ckpt = checkpoint_dir(CASE, tiny=True)
    model = load_policy(ckpt, model_spec(CASE, tiny=True), "float32", "cpu")
    eos = load_tokenizer(ckpt).eos_token_id

    def rollout(inject=None):
        engine = RolloutEngine(model, temperature=T, max_new_tokens=8, eos_id=eos, pad_id=eos, inject=inject)
        return engine.generate([(11, 12, 13, 14)], n=4, seed=3)[0]

    group, mismatched = rollout(), rollout(Inject("temperature-mismatch"))
    with torch.no_grad():
        logits = model(input_ids=group.tokens, use_cache=False).logits[:, group.prompt_len - 1 : -1].float()
    response = group.tokens[:, group.prompt_len :, None]  # (n, R, 1)
    at = {t: torch.log_softmax(logits / t, dim=-1) for t in (T, 1.0)}  # (n, R, V) each
    picked = {t: lp.gather(-1, response)[..., 0] for t, lp in at.items()}  # (n, R) each
    return torch, model, group, mismatched, at, picked


def test_the_two_temperatures_are_told_apart(run_at_t):
    *_, picked = run_at_t
    assert (picked[T] - picked[1.0]).abs().max() > 0.05


def test_rollout_engine_reports_log_probs_at_the_rollout_temperature(run_at_t):
    torch, _, group, _, _, picked = run_at_t
    assert torch.allclose(group.rollout_logprobs, picked[T], atol=1e-4)


def test_trainer_log_probs_and_entropy_are_at_the_rollout_temperature(run_at_t):
    from rlsmoke.engine.train import Trainer

    torch, model, group, _, at, picked = run_at_t
    trainer = Trainer(model, lr=1e-6, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0, eps_clip=0.2,
                      eps_clip_high=0.28, temperature=T)  # fmt: skip
    [(train_lp, entropy)] = trainer.forward_only([group])
    assert torch.allclose(train_lp, picked[T], atol=1e-4)
    assert torch.allclose(entropy, -(at[T].exp() * at[T]).sum(-1), atol=1e-4)
    assert torch.allclose(train_lp, group.rollout_logprobs, atol=1e-4)  # the clean run agrees


def test_temperature_mismatch_reports_the_rollout_log_probs_at_temperature_one(run_at_t):
    torch, _, group, mismatched, _, picked = run_at_t
    assert torch.equal(mismatched.tokens, group.tokens)  # same seed, same samples: only the report differs
    assert torch.allclose(mismatched.rollout_logprobs, picked[1.0], atol=1e-4)
    assert not torch.allclose(mismatched.rollout_logprobs, picked[T], atol=1e-2)
