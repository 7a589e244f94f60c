"""The engine's pure parts: GRPO math, rewards, masks, sync checks and config validation.

torch and the engine modules are imported by fixtures, so collecting this module stays cheap.
"""

import math

import pytest

from rlsmoke.engine.config import Inject, RunConfig, parse_inject
from rlsmoke.engine.reward import math_reward, target_reward
from rlsmoke.errors import RlsmokeError


@pytest.fixture(scope="module")
def torch():
    import torch

    return torch


@pytest.fixture(scope="module")
def grpo():
    from rlsmoke.engine import grpo

    return grpo


@pytest.fixture(scope="module")
def sync():
    from rlsmoke.engine import sync

    return sync


def test_group_advantages_normalize_within_each_group(torch, grpo):
    adv = grpo.group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]]))
    assert adv[0].mean().abs() < 1e-6 and adv[0].std() == pytest.approx(1.0, rel=1e-4)
    assert torch.equal(adv[1], torch.zeros(4))  # no variance, no signal


def test_sample_mean_is_per_sample_then_across_and_ignores_masked_and_nan(torch, grpo):
    x = torch.tensor([[1.0, 3.0, 100.0], [2.0, float("nan"), 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert grpo.sample_mean(x, mask).item() == pytest.approx((2.0 + 1.0) / 2)  # NaN counts 0, masked dropped


def test_train_rollout_stats_zero_when_equal_and_k3_positive_otherwise(torch, grpo):
    lp = torch.log(torch.tensor([[0.5, 0.25]]))
    mask = torch.ones(1, 2)
    same = grpo.train_rollout_stats(lp, lp, mask)
    assert same == {"train/train_rollout_logprob_abs_diff": 0.0, "train/train_rollout_logprob_abs_diff_max": 0.0,
                    "train/train_rollout_kl": 0.0}  # fmt: skip
    off = grpo.train_rollout_stats(lp, lp + torch.tensor([[0.1, -0.3]]), mask)
    assert off["train/train_rollout_logprob_abs_diff"] == pytest.approx(0.2)
    assert off["train/train_rollout_logprob_abs_diff_max"] == pytest.approx(0.3)
    assert off["train/train_rollout_kl"] > 0
    assert grpo.k3(torch.zeros(1), torch.full((1,), 100.0)).item() == grpo.KL_CLAMP


def test_train_rollout_kl_is_kl_of_rollout_to_train_as_miles_logs_it(torch, grpo):
    # Miles: compute_approx_kl(rollout, train, "low_var_kl") = exp(train - rollout) - 1 - (train - rollout)
    train, rollout, mask = torch.zeros(1, 1), torch.full((1, 1), -1.0), torch.ones(1, 1)
    kl = grpo.train_rollout_stats(train, rollout, mask)["train/train_rollout_kl"]
    assert kl == pytest.approx(math.e - 2, rel=1e-6)  # 0.718; the reverse direction would give 1/e = 0.368
    reverse = grpo.train_rollout_stats(rollout, train, mask)["train/train_rollout_kl"]
    assert reverse == pytest.approx(math.exp(-1))


def test_k3_is_miles_low_var_kl_with_its_clamps(torch, grpo):
    # r = base - logp, clamped to +-20 before exp (NaN -> 0, +-inf -> +-20); the estimate clamped to [-10, 10]
    logp = torch.tensor([0.0, 0.0, -math.inf, 0.0, 0.0, 0.0])
    base = torch.tensor([-1.0, 0.5, 0.0, math.nan, -math.inf, -30.0])
    expected = [math.exp(-1) - 1 + 1, math.exp(0.5) - 1.5, 10.0, 0.0, 10.0, 10.0]
    assert grpo.k3(logp, base).tolist() == pytest.approx(expected, rel=1e-6)
    assert torch.isfinite(grpo.k3(logp, base)).all()


def test_policy_loss_clips_at_asymmetric_eps(torch, grpo):
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.1, 1.3, 0.7]]))  # ratios 1.1, 1.3 (> 1.28), 0.7 (< 0.8)
    mask = torch.ones(1, 3)
    _, clipped, ppo_kl = grpo.policy_loss(logp, old, torch.tensor([1.0]), mask, 0.2, 0.28)
    assert clipped.tolist() == [[0.0, 1.0, 0.0]]  # positive advantage: only the upper clip binds
    _, clipped, _ = grpo.policy_loss(logp, old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    assert clipped.tolist() == [[0.0, 0.0, 1.0]]
    assert torch.allclose(ppo_kl, -logp)


@pytest.mark.parametrize(("response", "label", "reward"), [
    ("so \\boxed{12}.", "12", 1.0), ("it is 7 then 12", "12", 1.0), ("\\boxed{1,024}", "1024", 1.0),
    ("\\boxed{13} or 12", "12", 0.0), ("no number", "12", 0.0), ("12.0", "12", 1.0),
])  # fmt: skip
def test_math_reward(response, label, reward):
    assert math_reward(response, [], label) == reward


def test_target_reward_is_the_share_of_target_tokens():
    assert target_reward("", [4, 5, 8, 9], "") == 0.5
    assert target_reward("", [], "") == 0.0


def test_response_mask_keeps_the_first_eos_and_drops_the_rest(torch):
    from rlsmoke.engine.rollout import response_mask

    assert response_mask(torch.tensor([[5, 0, 7, 0], [5, 6, 7, 8]]), eos_id=0).tolist() == [
        [1, 1, 0, 0],
        [1, 1, 1, 1],
    ]


def test_sync_compare_counts_each_mismatched_parameter_after_the_cast(torch, sync):
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    b.load_state_dict(a.state_dict())
    expected = list(sync.rollout_weights(a, torch.float32))
    assert sync.load_and_compare(b, expected, load=False)["sync/mismatched_params"] == 0
    with torch.no_grad():
        b.weight[0, 0] += 1e-6
    got = sync.load_and_compare(b, expected, load=False)
    assert got["sync/mismatched_params"] == 1 and got["sync/max_abs_diff"] == pytest.approx(1e-6, rel=0.1)
    # In bf16 the same 1e-6 change rounds away: equality is judged in what the engine samples with.
    b16 = torch.nn.Linear(4, 4).to(torch.bfloat16)
    sync.load_and_compare(b16, sync.rollout_weights(a, torch.bfloat16))
    assert (
        sync.load_and_compare(b16, sync.rollout_weights(a, torch.bfloat16), load=False)[
            "sync/mismatched_params"
        ]
        == 0
    )


@pytest.mark.parametrize(("text", "expected"), [
    (None, Inject()), ("stale-weights", Inject("stale-weights")), ("rollout-noise=0.01", Inject("rollout-noise", 0.01)),
])  # fmt: skip
def test_parse_inject(text, expected):
    assert parse_inject(text) == expected


@pytest.mark.parametrize(("text", "match"), [
    ("bitflip", "unknown"), ("rollout-noise", "needs a value"), ("stale-weights=1", "takes no value"),
    ("rollout-noise=x", "not a number"),
])  # fmt: skip
def test_parse_inject_rejects(text, match):
    with pytest.raises(RlsmokeError, match=match):
        parse_inject(text)


@pytest.mark.parametrize(("changes", "flag"), [
    ({"inject": Inject("temperature-mismatch")}, "--rollout-temperature"),
    ({"inject": Inject("stale-weights"), "num_rollout": 1}, "--num-rollout"),
    ({"n_samples": 1}, "--n-samples"),
    ({"reward": "bleu"}, "--reward"),
])  # fmt: skip
def test_config_rejects_bad_combinations_naming_the_flag(changes, flag):
    with pytest.raises(RlsmokeError, match=flag):
        RunConfig(case="glm5-744b-a40b-4layer", tiny=True).replace(**changes).validate()


def test_nan_loss_is_a_named_run_error(tmp_path, torch):
    from rlsmoke.engine.model import checkpoint_dir, load_policy
    from rlsmoke.engine.rollout import Group
    from rlsmoke.engine.train import Trainer
    from rlsmoke.errors import RunError
    from rlsmoke.models import model_spec

    spec = model_spec("glm4.5-355b-a32b-4layer", tiny=True)
    model = load_policy(checkpoint_dir(spec.name, tiny=True), spec, "float32", "cpu")
    with torch.no_grad():
        model.lm_head.weight[0, 0] = math.nan
    group = Group(0, 2, torch.tensor([[1, 2, 3, 4]] * 2), torch.ones(2, 2), torch.zeros(2, 2))
    trainer = Trainer(model, lr=1e-6, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0, eps_clip=0.2,
                      eps_clip_high=0.28)  # fmt: skip
    with pytest.raises(RunError, match="loss is nan") as err:
        trainer.step([group], [torch.zeros(2, 2)], [torch.tensor([1.0, -1.0])])
    assert err.value.rule == "train.finite_loss"


def _group_sums(torch, seed: int, loss: float | None = None):
    from rlsmoke.engine.train import group_loss

    g = torch.Generator().manual_seed(seed)
    logp, old_lp = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g)
    entropy, mask = torch.rand(4, 6, generator=g), (torch.rand(4, 6, generator=g) > 0.2).float()
    got, sums = group_loss(logp, entropy, mask, old_lp, torch.randn(4, generator=g), eps_clip=0.2,
                           eps_clip_high=0.28, entropy_coef=0.0)  # fmt: skip
    return (got if loss is None else torch.tensor(loss)), sums


def test_step_sums_are_the_groups_sums_added_in_python_one_by_one(torch):
    """The sums stay on the device until the step's last group (one wait for the host, not one a group)
    and come out as the per-group `.item()` sums gave them, bit for bit."""
    from rlsmoke.engine.rollout import Group
    from rlsmoke.engine.train import STEP_SUMS, StepSums

    step_sums, expected = StepSums(), dict.fromkeys(STEP_SUMS, 0.0)
    for i in range(3):
        loss, sums = _group_sums(torch, i)
        step_sums.add(Group(i, 2, torch.zeros(4, 8), torch.ones(4, 6), torch.zeros(4, 6)), loss, sums)
        for k, v in sums.items():
            expected[k] += v.item()
    assert isinstance(expected["pg_clipfrac"], float) and expected["pg_clipfrac"] > 0  # counted, as ints
    assert step_sums.totals() == expected
    assert StepSums().totals() == dict.fromkeys(STEP_SUMS, 0.0)


def test_step_sums_name_the_first_group_whose_loss_was_not_finite(torch):
    from rlsmoke.engine.rollout import Group
    from rlsmoke.engine.train import StepSums
    from rlsmoke.errors import RunError

    step_sums = StepSums()
    for i, loss in enumerate([None, math.inf, math.nan]):
        step_sums.add(Group(10 + i, 2, torch.zeros(4, 8), torch.ones(4, 6), torch.zeros(4, 6)),
                      *_group_sums(torch, i, loss))  # fmt: skip
    with pytest.raises(RunError, match="loss is inf on group 11") as err:
        step_sums.totals()
    assert err.value.rule == "train.finite_loss"


def test_kl_loss_is_miles_low_var_kl_of_the_policy_to_the_reference_at_the_rollout_temperature(torch):
    # Miles: compute_approx_kl(log_probs, ref_log_probs, "low_var_kl"), both at --rollout-temperature
    from rlsmoke.engine.model import checkpoint_dir, load_policy
    from rlsmoke.engine.rollout import Group
    from rlsmoke.engine.train import Trainer, token_logprobs
    from rlsmoke.models import model_spec

    spec = model_spec("glm4.5-355b-a32b-4layer", tiny=True)
    model, ref = (load_policy(checkpoint_dir(spec.name, tiny=True), spec, "float32", "cpu") for _ in range(2))
    noise = torch.randn(ref.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref.lm_head.weight.add_(0.05 * noise)  # a reference the policy differs from
    group = Group(0, 2, torch.tensor([[1, 2, 3, 4, 5, 6]] * 2), torch.ones(2, 4), torch.zeros(2, 4))
    t = 0.5
    with torch.no_grad():
        logp, ref_lp = token_logprobs(model, group, t)[0], token_logprobs(ref, group, t)[0]
    d = ref_lp - logp
    trainer = Trainer(model, lr=1e-6, betas=(0.9, 0.98), weight_decay=0.1, grad_clip=1.0, eps_clip=0.2,
                      eps_clip_high=0.28, kl_coef=0.01, ref_model=ref, temperature=t)  # fmt: skip
    kl_loss = trainer.step([group], [logp], [torch.tensor([1.0, -1.0])])["train/kl_loss"]
    assert kl_loss == pytest.approx((d.exp() - 1 - d).mean().item(), rel=1e-4)
    assert kl_loss != pytest.approx(((-d).exp() - 1 + d).mean().item(), rel=1e-2)  # not the reverse direction


def test_load_and_compare_builds_each_weight_once_and_still_sees_a_skipped_load(torch, sync):
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    built = []

    def weights():
        for name, t in sync.rollout_weights(a, torch.float32):
            built.append(name)
            yield name, t

    stale = sync.load_and_compare(b, weights(), load=False)  # the stale-weights fault: nothing copied
    assert stale["sync/mismatched_params"] == 2 and built == ["weight", "bias"]
    built.clear()
    assert sync.load_and_compare(b, weights())["sync/mismatched_params"] == 0
    assert built == ["weight", "bias"] and torch.equal(b.weight, a.weight)  # one build per parameter
    extra = [*sync.rollout_weights(a, torch.float32), ("not.in.the.engine", torch.zeros(1))]
    assert sync.load_and_compare(b, extra)["sync/mismatched_params"] == 1  # counted, not a KeyError
