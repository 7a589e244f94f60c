"""The rollout's batching: a rank's groups in one left-padded generate call sample what each group's own
seed says, whatever else is in the batch; one call per group draws exactly what `generate(do_sample=True)`
drew for that group after `torch.manual_seed` (the CPU thresholds' calibration).
"""

import builtins

import pytest
import torch

from rlsmoke.engine import rollout
from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.model import checkpoint_dir, load_policy, load_tokenizer
from rlsmoke.engine.rollout import GroupSampler, RolloutEngine
from rlsmoke.engine.train import token_logprobs
from rlsmoke.models import model_spec
from rlsmoke.shipped import FIXTURES

CASE = "glm5-744b-a40b-4layer"
N, TOKENS, SEED = 3, 8, 5


@pytest.fixture(scope="module")
def setup():
    ckpt = checkpoint_dir(CASE, tiny=True)
    tok = load_tokenizer(ckpt)
    model = load_policy(ckpt, model_spec(CASE, tiny=True), "float32", "cpu")
    prompts = [encode(tok, p).ids for p in read_prompts(FIXTURES / "data" / "math.jsonl", 3, 0)]
    assert len({len(p) for p in prompts}) == 3  # the batch needs left padding
    return model, prompts, tok.eos_token_id


def _engine(model, eos, batch):
    return RolloutEngine(model, temperature=0.9, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch=batch)


def test_one_call_per_group_draws_what_generate_drew(setup):
    model, prompts, eos = setup
    group = _engine(model, eos, "group").generate(prompts, N, SEED, indices=[1])[0]
    torch.manual_seed(SEED * 1000 + 1)
    x = torch.tensor([prompts[1]] * N)
    expected = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, temperature=0.9, top_k=0,
                              top_p=1.0, max_new_tokens=TOKENS, min_new_tokens=1, eos_token_id=eos, pad_token_id=eos)  # fmt: skip
    assert torch.equal(group.tokens, expected)


def test_a_group_samples_the_same_alone_or_in_a_padded_batch(setup):
    model, prompts, eos = setup
    alone = _engine(model, eos, "group").generate(prompts, N, SEED, indices=[2])[0]
    batched = _engine(model, eos, "rank").generate(prompts, N, SEED, indices=[0, 1, 2])
    assert [g.prompt_index for g in batched] == [0, 1, 2]
    assert torch.equal(batched[2].tokens, alone.tokens)
    assert torch.equal(batched[2].mask, alone.mask)
    for g in batched:  # the padding leaks into no log-prob: the unpadded train forward agrees
        train_lp, _ = token_logprobs(model, g, temperature=0.9)
        assert g.tokens.shape[1] == g.prompt_len + g.mask.shape[1]
        assert (train_lp - g.rollout_logprobs).abs()[g.mask > 0].max() < 1e-4


def test_one_generator_for_the_batch_makes_a_group_depend_on_its_neighbours(setup, monkeypatch):
    """The fault twin: sampling the batch from one generator, as a plain `generate` would."""

    def shared(self, input_ids, scores):
        probs = torch.softmax(scores / self.temperature, dim=-1)
        chosen = torch.multinomial(probs, num_samples=1, generator=self.generators[0])[:, 0]
        return torch.full_like(scores, float("-inf")).scatter_(1, chosen[:, None], 0.0)

    model, prompts, eos = setup
    monkeypatch.setattr(GroupSampler, "__call__", shared)
    alone = _engine(model, eos, "group").generate(prompts, N, SEED, indices=[2])[0]
    batched = _engine(model, eos, "rank").generate(prompts, N, SEED, indices=[0, 1, 2])
    assert not torch.equal(batched[2].tokens[:, batched[2].prompt_len :], alone.tokens[:, alone.prompt_len :])


def test_a_batch_by_length_returns_the_groups_in_prompt_order(setup):
    """`one_run` pairs each group with its prompt (and its reward label) by position."""
    model, prompts, eos = setup
    shuffled = [prompts[1], prompts[2], prompts[0]]  # lengths not in order: calls go shortest first
    assert sorted(map(len, shuffled)) != list(map(len, shuffled))
    groups = _engine(model, eos, "length").generate(shuffled, N, SEED)
    assert [g.prompt_index for g in groups] == [0, 1, 2]
    assert [g.prompt_len for g in groups] == [len(p) for p in shuffled]


def test_the_order_check_sees_groups_in_call_order(setup, monkeypatch):
    """Its twin: without the sort, the length batch hands the groups back shortest first."""
    model, prompts, eos = setup
    unsorted_groups = lambda items, key=None: list(items) if key else builtins.sorted(items)  # noqa: E731
    monkeypatch.setattr(rollout, "sorted", unsorted_groups, raising=False)
    shuffled = [prompts[1], prompts[2], prompts[0]]
    groups = _engine(model, eos, "length").generate(shuffled, N, SEED)
    assert [g.prompt_len for g in groups] != [len(p) for p in shuffled]


@pytest.mark.parametrize(("choice", "device", "family", "kda", "expected"), [
    ("auto", "cpu", "glm5", "", "group"), ("auto", "cuda", "glm5", "", "rank"),
    ("auto", "cuda", "glm5.3-flash", "reference", "length"), ("rank", "cpu", "glm5.3-flash", "reference", "length"),
    ("auto", "cuda", "glm5.3-flash", "fla", "rank"), ("rank", "cuda", "glm5.3-flash", "fla", "rank"),
    ("group", "cuda", "glm4.5", "", "group"),
])  # fmt: skip
def test_the_batch_each_device_and_model_gets(choice, device, family, kda, expected):
    assert rollout.batch_for(choice, device, family, kda) == expected


def test_flash_s_kda_layers_carry_left_padding():
    """GLM-5.3-Flash in one left-padded call (its GPU batch on fla's kernels): the padded positions are
    zeroed before the projections, so the short convolution and the recurrent state see nothing of them
    and each group samples what it samples alone; the unpadded train forward agrees."""
    case = "glm5.3-flash-4layer"
    ckpt = checkpoint_dir(case, tiny=True)
    tok = load_tokenizer(ckpt)
    model = load_policy(ckpt, model_spec(case, tiny=True), "float32", "cpu")
    prompts = [encode(tok, p).ids for p in read_prompts(FIXTURES / "data" / "math.jsonl", 3, 0)]
    eos = tok.eos_token_id
    alone = _engine(model, eos, "group").generate(prompts, N, SEED, indices=[2])[0]
    batched = RolloutEngine(
        model, temperature=0.9, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch="rank"
    )
    groups = batched.generate(prompts, N, SEED, indices=[0, 1, 2])
    assert torch.equal(groups[2].tokens, alone.tokens)
    for g in groups:
        train_lp, _ = token_logprobs(model, g, temperature=0.9)
        assert (train_lp - g.rollout_logprobs).abs()[g.mask > 0].max() < 1e-4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="a CUDA device's draws are checked where there is one"))])  # fmt: skip
def test_the_group_sampler_draws_what_multinomial_draws_from_each_group_s_generator(device):
    """One argmax over the batch, no validity read on the host: the tokens and the generators' states
    after are what `torch.multinomial` per group gives."""
    rows = [slice(0, 4), slice(4, 8), slice(8, 12)]
    scores = torch.randn(12, 5000, generator=torch.Generator().manual_seed(1)).mul(4).to(device)

    def generators():
        return [torch.Generator(device=device).manual_seed(100 + k) for k in range(len(rows))]

    ours, theirs = generators(), generators()
    for _ in range(5):  # consecutive steps draw on from each generator
        picked = GroupSampler(0.9, rows, ours)(None, scores).argmax(-1)
        probs = torch.softmax(scores / 0.9, dim=-1)
        drawn = torch.cat(
            [torch.multinomial(probs[r], 1, generator=g)[:, 0] for r, g in zip(rows, theirs, strict=True)]
        )
        assert torch.equal(picked, drawn)
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ours, theirs, strict=True))


def test_a_rollout_whose_log_probs_are_not_finite_stops_the_run(setup):
    """`rollout.finite_logprobs`: a NaN in the rollout model's logits stops the run naming the group (the
    gates' means skip non-finite tokens, so this rule is what sees a broken rollout)."""
    from rlsmoke.errors import RunError

    model, prompts, eos = setup
    healthy = _engine(model, eos, "rank").generate(prompts, N, SEED)
    assert all(torch.isfinite(g.rollout_logprobs[g.mask > 0]).all() for g in healthy)
    broken = load_policy(checkpoint_dir(CASE, tiny=True), model_spec(CASE, tiny=True), "float32", "cpu")
    with torch.no_grad():
        broken.lm_head.weight[:, 0] = float("nan")  # every row's logits NaN
    with pytest.raises(RunError, match="not finite on group 0") as err:
        _engine(broken, eos, "rank").generate(prompts, N, SEED)
    assert err.value.rule == "rollout.finite_logprobs"
