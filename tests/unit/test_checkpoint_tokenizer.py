"""The fixture tokenizer: a real `tokenizers` BPE, inside every model's vocab, GLM chat format, reproducible."""

import pytest
from transformers import AutoTokenizer

from rlsmoke.checkpoints.make_tokenizer import SPECIAL_TOKENS, build
from rlsmoke.checkpoints.synthesis import FIXTURE_TOKENIZER, tokenizer_ids
from rlsmoke.models import MODEL_NAMES, model_spec


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(FIXTURE_TOKENIZER)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("tiny", [False, True])
def test_fits_every_vocab(name, tiny):
    assert tokenizer_ids()["size"] <= model_spec(name, tiny=tiny).vocab_size


def test_special_tokens_and_round_trip(tok):
    assert len(tok) <= 4096
    assert all(len(tok.encode(t, add_special_tokens=False)) == 1 for t in SPECIAL_TOKENS)
    text = "What is 12 + 7? The answer is \\boxed{19}."
    assert tok.decode(tok.encode(text)) == text


def test_glm_chat_template(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "[gMASK]<sop><|system|>\nBe brief.<|user|>\nWhat is 2 + 3?<|assistant|>"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[:2] == tok.convert_tokens_to_ids(["[gMASK]", "<sop>"]) and ids[
        -1
    ] == tok.convert_tokens_to_ids("<|assistant|>")
    closed = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert closed.endswith("<|assistant|>\n<think></think>")


def test_script_reproduces_the_fixture(tmp_path):
    build(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / f).read_bytes() == (FIXTURE_TOKENIZER / f).read_bytes(), f
