"""The static decode (`--rollout-decode static`, `auto`'s choice on NVIDIA GPUs; engine.decode) samples what `generate` samples: the same
tokens from each group's generator and the same log-probs, to fp32 rounding, on every model it supports.

Why a tolerance and not equality: the static cache attends over its whole bucket (the unwritten keys
masked), `generate`'s over the keys written so far, so the attention's sums run in another order; in fp32
on CPU the logits move by about 1e-5 (measured on the three tiny models, transformers 5.17 and 5.25).
LOGPROB_TOL is under the CPU gates' bound on train/train_rollout_logprob_abs_diff_max (4.3e-5 to 8.4e-5,
fixtures/thresholds/builtin.json), so the gates cannot tell the paths apart; a sample drawn at a threshold
the rounding crosses would show as other tokens, and none does at these seeds. The train forward against
the static rollout is held to what the gates hold a run to: the case's own bound (its rounding depends on
the CPU's kernels: 4.2e-5 for GLM-5 on one host, under 4e-5 on another).
"""

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from rlsmoke.engine import decode
from rlsmoke.engine.data import encode, read_prompts
from rlsmoke.engine.model import checkpoint_dir, load_policy, load_tokenizer
from rlsmoke.engine.rollout import RolloutEngine
from rlsmoke.engine.train import token_logprobs
from rlsmoke.models import model_spec
from rlsmoke.runkey import RunKey
from rlsmoke.shipped import FIXTURES
from rlsmoke.thresholds import lookup_gates

N, TOKENS, SEED, T = 3, 8, 5, 0.9
LOGPROB_TOL = 4e-5
CASES = ("glm5-744b-a40b-4layer", "glm4.5-355b-a32b-4layer", "glm5.3-flash-4layer")


def _load(case):
    ckpt = checkpoint_dir(case, tiny=True)
    tok = load_tokenizer(ckpt)
    model = load_policy(ckpt, model_spec(case, tiny=True), "float32", "cpu")
    prompts = [encode(tok, p).ids for p in read_prompts(FIXTURES / "data" / "math.jsonl", 3, 0)]
    return model, prompts, tok.eos_token_id, case


@pytest.fixture(scope="module", params=CASES)
def loaded(request):
    return _load(request.param)


@pytest.fixture(scope="module")
def glm5():
    return _load(CASES[0])


def _rollout(model, prompts, eos, decode_as, batch, seed=SEED):
    engine = RolloutEngine(model, temperature=T, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch=batch,
                           decode=decode_as)  # fmt: skip
    return engine, engine.generate(prompts, N, seed)


def differences(expected, got) -> list[str]:
    """What tells two rollouts apart: tokens, masks, or a log-prob past LOGPROB_TOL."""
    out = []
    for a, b in zip(expected, got, strict=True):
        if not (torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)):
            out.append(f"group {a.prompt_index}: other tokens")
            continue
        gap = (a.rollout_logprobs - b.rollout_logprobs).abs()[a.mask > 0].max().item()
        if gap > LOGPROB_TOL:
            out.append(f"group {a.prompt_index}: log-probs {gap:.2e} apart")
    return out


def gate_bound(case: str) -> float:
    """The CPU gate's bound on the largest train-vs-rollout log-prob gap of a built-in run of `case`."""
    gates = lookup_gates(RunKey(case, platform="cpu", device="CPU", launcher="builtin"))
    return next(g.bound for g in gates if g.name == "logprob_abs_diff_max")


def test_static_samples_what_generate_samples(loaded):
    """One left-padded call for the rank (the GPU batch), then one call per prompt length, which resets
    and reuses the cache (the recurrent KDA state too); the train forward agrees with it as the gates ask."""
    model, prompts, eos, case = loaded
    for batch in ("rank", "length"):
        _, expected = _rollout(model, prompts, eos, "generate", batch)
        engine, got = _rollout(model, prompts, eos, "static", batch)
        assert engine.fallback is None and {g.decode for g in got} == {"static"}
        assert differences(expected, got) == []
    for g in got:
        train_lp, _ = token_logprobs(model, g, temperature=T)
        assert (train_lp - g.rollout_logprobs).abs()[g.mask > 0].max() <= gate_bound(case)


def test_rows_that_end_early_end_as_generate_ends_them(glm5, monkeypatch):
    """EOS mid-response: the row takes the pad token after it, the call stops when every row has ended (the
    host looks every CHECK_EVERY steps, here 2) and the columns past that are dropped."""
    model, prompts, eos, _ = glm5
    _, first = _rollout(model, prompts, eos, "generate", "rank")
    eos = int(first[0].response[0, 2])  # a token sampled at step 2: row 0 of group 0 ends there
    monkeypatch.setattr(decode, "CHECK_EVERY", 2)
    _, expected = _rollout(model, prompts, eos, "generate", "rank")
    _, got = _rollout(model, prompts, eos, "static", "rank")
    assert expected[0].mask[0].sum() == 3 and (expected[0].response[0, 3:] == eos).all()
    assert differences(expected, got) == []


def test_a_cache_written_one_slot_late_is_caught(loaded):
    """The twin: after the prefill every layer writes one slot past where the mask says (the step's own key
    masked out, an empty one read in its place); the tokens or the log-probs move past the tolerance."""
    model, prompts, eos, _ = loaded
    _, expected = _rollout(model, prompts, eos, "generate", "rank")
    engine = RolloutEngine(model, temperature=T, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch="rank",
                           decode="static")  # fmt: skip
    static = engine.static
    assert static is not None
    moved = []

    def one_slot_late(tokens, positions, mask, cache):
        if not moved:
            for layer in cache.layers:
                for name in ("cumulative_length", "indexer_cumulative_length"):
                    if isinstance(written := getattr(layer, name, None), torch.Tensor):
                        moved.append(written.add_(1))
        return static._forward(tokens, positions, mask, cache)

    static.step = one_slot_late
    assert differences(expected, engine.generate(prompts, N, SEED)) != []
    assert moved


def test_a_failed_capture_falls_back_to_generate_named(glm5):
    """A step that raises (the compiler refusing a model's modeling) leaves the call to generate, which draws
    the same numbers from fresh generators; the run keeps generate and the groups say why."""
    model, prompts, eos, _ = glm5
    _, expected = _rollout(model, prompts, eos, "generate", "rank")
    engine = RolloutEngine(model, temperature=T, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch="rank",
                           decode="static")  # fmt: skip

    def refused(*args):
        raise RuntimeError("cannot capture this step\nsecond line")

    assert engine.static is not None
    engine.static.step = refused
    got = engine.generate(prompts, N, SEED)
    assert [(g.decode, g.fallback) for g in got] == [
        ("generate", "RuntimeError: cannot capture this step")
    ] * 3
    assert all(torch.equal(a.tokens, b.tokens) and torch.equal(a.rollout_logprobs, b.rollout_logprobs)
               for a, b in zip(expected, got, strict=True))  # fmt: skip
    assert engine.static is None
    assert decode.record("static", {(g.decode, g.fallback) for g in got}) == {
        "asked": "static", "ran": ["generate"], "fallback": "RuntimeError: cannot capture this step"}  # fmt: skip


def test_a_model_without_a_kv_cache_keeps_generate_and_says_why():
    """Mamba's forward takes its own recurrent cache, no KV cache nor positions: static is refused before
    any call, and the rollout is generate's."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(0)
    config = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, eos_token_id=1,
                         pad_token_id=0, bos_token_id=0)  # fmt: skip
    model = MambaForCausalLM(config).eval()
    prompts = [(5, 6, 7), (8, 9)]
    engine, got = _rollout(model, prompts, 1, "static", "group")
    _, expected = _rollout(model, prompts, 1, "generate", "group")
    assert engine.static is None and "MambaForCausalLM.forward takes no KV cache" in (engine.fallback or "")
    assert {(g.decode, g.fallback) for g in got} == {("generate", engine.fallback)}
    assert differences(expected, got) == []
    assert decode.record("static", {(g.decode, g.fallback) for g in got})["fallback"] == engine.fallback


def test_a_capture_that_raises_before_the_first_rollout_leaves_the_run_on_generate_named(glm5):
    """The load captures the step (`RolloutEngine.capture`); where that raises, the run rolls out with
    generate from its first call, and the groups say why."""
    model, prompts, eos, _ = glm5
    engine = RolloutEngine(model, temperature=T, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch="rank",
                           decode="static")  # fmt: skip
    assert engine.static is not None
    engine.static.compiled = True  # as on a GPU: the CPU's eager step is not captured

    def refused(*args, **kwargs):
        raise RuntimeError("capture failed")

    engine.static.capture = refused
    engine.capture(len(prompts), N)
    assert engine.static is None and engine.fallback == "RuntimeError: capture failed"
    got = engine.generate(prompts, N, SEED)
    assert {(g.decode, g.fallback) for g in got} == {("generate", engine.fallback)}


def test_every_call_s_cache_is_as_long_as_the_longest_prompt_needs(glm5):
    """One cache length for the run, from the prompt file's longest prompt: a seed of short prompts uses the
    graph the load captured, and samples what its own shorter cache would."""
    model, prompts, eos, _ = glm5
    short = [p[-4:] for p in prompts]  # a call 4 tokens wide
    longest = 2 * decode.LENGTH_BUCKET  # its own bucket would be one LENGTH_BUCKET
    sized = RolloutEngine(model, temperature=T, max_new_tokens=TOKENS, eos_id=eos, pad_id=eos, batch="rank",
                          decode="static", longest_prompt=longest)  # fmt: skip
    got = sized.generate(short, N, SEED)
    assert sized.static is not None
    assert list(sized.static.caches) == [(N * len(short), 3 * decode.LENGTH_BUCKET)]
    _, own = _rollout(model, short, eos, "static", "rank")
    assert differences(own, got) == []


def _indexers(model):
    return [m for m in model.modules() if hasattr(m, "index_kpool")]


def _static(model, own_pooling: bool = False) -> decode.StaticDecoder:
    """A static decoder; `own_pooling`: with transformers' own indexer pooling, not `every_pool`."""
    static = decode.StaticDecoder(model)
    for indexer in _indexers(model) if own_pooling else ():
        del indexer.get_pooled_states  # the class's method again
    return static


def _sized_by_data(static, prompts) -> list[str]:
    """The shapes the data decide in one decode step over the static cache, as inductor would trace it."""
    ids, width = torch.tensor([prompts[0]] * 2), len(prompts[0])
    cache = static._cache(2, decode.LENGTH_BUCKET)
    mask = torch.zeros(2, decode.LENGTH_BUCKET, dtype=torch.long)
    mask[:, : width + 1] = 1
    positions = torch.arange(width)[None].expand(2, -1)
    found = []

    def inspect_graph(gm, example_inputs):  # what inductor asks before it captures a graph
        values = [n.meta["example_value"] for n in gm.graph.nodes if "example_value" in n.meta]
        found.extend(str(s) for v in values for s in free_unbacked_symbols(v))
        return gm.forward

    one_graph = torch.compile(static._forward, backend=inspect_graph, fullgraph=True, dynamic=False)
    with torch.no_grad():
        logits = static._forward(ids, positions, mask[:, :width], cache)
        try:
            one_graph(logits.argmax(-1)[:, None], positions[:, -1:] + 1, mask, cache)
        finally:
            torch._dynamo.reset()
    return found


def test_a_gpu_captures_every_model_s_decode_step(loaded):
    """Each model's decode step over the static cache traces as one graph of fixed shapes (GLM-5.3-Flash's
    with `every_pool`), as a CUDA graph needs; none is refused up front."""
    model, prompts, _, _ = loaded
    assert _sized_by_data(_static(model), prompts) == []
    assert decode.unsupported(model) is None


def _logits_of_steps(static, prompts) -> list[torch.Tensor]:
    """A left-padded prefill of two rows over the static cache, then four decode steps: each one's logits."""
    short, long = list(prompts[0]) * 2, list(prompts[1]) * 3
    pad = len(long) - len(short)
    ids = torch.tensor([[0] * pad + short, long])
    attention = torch.ones_like(ids)
    attention[0, :pad] = 0
    cache = static._cache(2, decode.LENGTH_BUCKET)
    mask = torch.zeros(2, decode.LENGTH_BUCKET, dtype=torch.long)
    mask[:, : ids.shape[1]] = attention
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = [static._forward(ids, positions, mask[:, : ids.shape[1]], cache)]
        for t in range(4):
            mask[:, ids.shape[1] + t] = 1
            step = positions[:, -1:] + 1 + t
            out.append(static._forward(out[-1].argmax(-1)[:, None], step, mask, cache))
    return out


def test_flash_s_indexer_keeps_every_pool_and_selects_what_transformers_selects():
    """The twin of the capture above: transformers' own pooling drops the pools no row sees, a shape the data
    decide; `every_pool` keeps them, and the logits of a left-padded prefill and of each decode step over
    the static cache come out bit for bit as transformers' own give them. A top-k of one pool (16 slots)
    over about 120 makes the pooled keys choose, as the full model's 2048 do past 2048 slots."""
    model, prompts, _, _ = _load(CASES[2])
    for indexer in _indexers(model):
        indexer.index_topk = indexer.index_kpool
    assert _sized_by_data(_static(model, own_pooling=True), prompts) != []

    transformers_own = _logits_of_steps(_static(model, own_pooling=True), prompts)
    ours = _logits_of_steps(_static(model), prompts)
    assert all(torch.equal(a, b) for a, b in zip(transformers_own, ours, strict=True))


def test_flash_s_decode_step_is_one_graph_though_its_kda_kernel_is_compiler_disabled(monkeypatch):
    """fla's KDA kernel is `torch.compiler.disable`d: called as it is, it cuts the decode step at every KDA
    layer (a graph break, which fullgraph refuses); through `kda.decode_step` the step stays one graph and
    its logits are the kernel's own, bit for bit."""
    from rlsmoke.engine import kda

    model, prompts, _, _ = _load(CASES[2])
    reference = kda._REFERENCE["recurrent_kimi_delta_attention"]
    monkeypatch.setitem(kda._DECODE, "kernel", torch.compiler.disable(reference))  # as fla's is
    assert _sized_by_data(_static(model), prompts) == []
    through_op = _logits_of_steps(_static(model), prompts)
    modeling = __import__(kda.MODELING, fromlist=["_"])
    monkeypatch.setattr(modeling, "recurrent_kimi_delta_attention", torch.compiler.disable(reference))
    with pytest.raises(torch._dynamo.exc.Unsupported):
        _sized_by_data(_static(model), prompts)
    direct = _logits_of_steps(_static(model), prompts)
    assert all(torch.equal(a, b) for a, b in zip(direct, through_op, strict=True))
