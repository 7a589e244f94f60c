"""Synthesized tiny checkpoints load in transformers with no missing or unexpected keys, and run."""

import json

import pytest
import torch
import transformers
from checkpoint_bytes import raw_tensors

from rlsmoke.checkpoints import synthesize
from rlsmoke.checkpoints.shards import load_index
from rlsmoke.checkpoints.synthesis import LOGIT_STD, next_token_entropy
from rlsmoke.models import model_spec

CASES = ["glm5-744b-a40b-4layer", "glm5.3-flash-4layer", "glm4.5-355b-a32b-4layer"]
# Measured 1.07 to 1.14 nats on the tiny cases with LOGIT_STD = 8 (uniform over 4096 tokens: 8.32).
MAX_ENTROPY_NATS = 1.6


@pytest.fixture(scope="module", params=CASES)
def checkpoint(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / request.param
    # tiny shards so that the index really spans several files
    return request.param, synthesize(request.param, out, tiny=True, max_shard_bytes=2_000_000)


def test_loads_with_no_missing_or_unexpected_keys_and_runs(checkpoint):
    case, folder = checkpoint
    spec = model_spec(case, tiny=True)
    assert len(load_index(folder)) and len(set(load_index(folder).values())) > 1
    cls = getattr(transformers, spec.hf_architecture)  # Glm5NextForConditionalGeneration for glm5_next
    model, info = cls.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    if spec.hf_model_type != "glm5_next":
        assert (
            type(transformers.AutoModelForCausalLM.from_pretrained(folder)).__name__ == spec.hf_architecture
        )
    entropy = next_token_entropy(model, spec.vocab_size)
    assert entropy < MAX_ENTROPY_NATS, (
        f"{case}: next-token entropy {entropy:.2f} nats with LOGIT_STD={LOGIT_STD}"
    )


def test_metadata_files(checkpoint):
    _, folder = checkpoint
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {"model.safetensors.index.json", "checksums.sha256"} <= names
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    assert tok.convert_ids_to_tokens(gen["eos_token_id"]) == ["<|endoftext|>", "<|user|>", "<|observation|>"]


def test_values_depend_on_seed_and_name_only(tmp_path):
    """Shard layout and thread count change no byte; another seed changes them."""
    a = synthesize("glm4.5-355b-a32b-4layer", tmp_path / "a", tiny=True, workers=1)
    b = synthesize("glm4.5-355b-a32b-4layer", tmp_path / "b", tiny=True, max_shard_bytes=500_000, workers=3)
    c = synthesize("glm4.5-355b-a32b-4layer", tmp_path / "c", tiny=True, seed=1)
    ta, tb, tc = raw_tensors(a), raw_tensors(b), raw_tensors(c)
    assert len(set(load_index(b).values())) > len(set(load_index(a).values()))
    assert ta.keys() == tb.keys()
    assert all(ta[k] == tb[k] for k in ta)
    assert ta["model.layers.0.mlp.up_proj.weight"] != tc["model.layers.0.mlp.up_proj.weight"]


def test_lm_head_rows_beyond_the_tokenizer_are_zero(tmp_path):
    """At full vocab (154880) only the tokenizer's 4096 ids get logits; checked on a narrowed spec."""
    spec = model_spec("glm4.5-355b-a32b-4layer", tiny=True).replace(vocab_size=5000)
    folder = synthesize(spec, tmp_path / "v", tiny=True)
    w = transformers.AutoModelForCausalLM.from_pretrained(folder).lm_head.weight
    assert w[4096:].abs().max() == 0 and w[:4096].abs().max() > 0


def test_an_expected_layout_is_built_once_per_config_and_never_answers_for_another(tmp_path, monkeypatch):
    """Every verify of every run asks for it: the answer is kept in the cache folder, keyed by the config."""
    from rlsmoke.checkpoints import synthesis
    from rlsmoke.models.hf import hf_config

    monkeypatch.setenv("RLSMOKE_CACHE", str(tmp_path))
    built = []
    build = synthesis._built_layout
    monkeypatch.setattr(synthesis, "_built_layout", lambda *args: built.append(args[0]) or build(*args))
    cfg = hf_config(model_spec("glm5-744b-a40b-4layer", tiny=True))
    first = synthesis.expected_layout(cfg)
    assert synthesis.expected_layout(cfg) == first and len(built) == 1
    (memo,) = (tmp_path / "layouts").glob("*.json")

    other = hf_config(model_spec("glm5-744b-a40b-4layer", tiny=True))
    other.vocab_size *= 2
    assert synthesis.expected_layout(other) != first and len(built) == 2  # its own entry, not the first's
    memo.write_text('{"model.embed_tokens.weight": ')  # a damaged entry is built again, never trusted
    assert synthesis.expected_layout(cfg) == first and len(built) == 3
