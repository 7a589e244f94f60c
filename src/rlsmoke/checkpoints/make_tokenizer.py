"""Regenerate fixtures/tokenizer/: a byte-level BPE of at most 4096 tokens with GLM's special tokens.

    python -m rlsmoke.checkpoints.make_tokenizer [OUT_DIR]

The corpus is generated here, so the output is reproducible; 4096 fits every model's vocab.
"""

from __future__ import annotations

import json
import operator
import random
import sys
from pathlib import Path

VOCAB_SIZE = 4096
# GLM-4.5/GLM-5's special tokens, in GLM's order; the ids differ (they start at 0 here).
SPECIAL_TOKENS = (
    "<|endoftext|> [MASK] [gMASK] [sMASK] <sop> <eop> <|system|> <|user|> <|assistant|> <|observation|> "
    "<|begin_of_image|> <|end_of_image|> <think> </think> <tool_call> </tool_call> <|pad|>"
).split()
EOS_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>"]  # GLM stops on all three

# GLM's chat format; enable_thinking=False closes an empty think block, as GLM-4.5 does.
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|system|>\n{{ m.content }}"
    "{%- elif m.role == 'user' -%}<|user|>\n{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>\n{{ m.content }}"
    "{%- elif m.role == 'observation' or m.role == 'tool' -%}<|observation|>\n{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '\\n<think></think>' }}{%- endif -%}"
    "{%- endif -%}"
)

PARAGRAPH = (
    "Solve the problem step by step and put the final answer in a box. A train leaves the station at "
    "noon and travels at a constant speed. How many kilometres does it cover in three hours? The sum "
    "of two numbers is the total; the difference is what remains when one is taken from the other. "
    "Multiply the price of one apple by the number of apples to find the cost. Therefore the answer is "
    "the value we computed above. Let x be the unknown, then write an equation and solve for x. "
    "The quick brown fox jumps over the lazy dog. Every integer greater than one is either prime or "
    "a product of primes. The area of a rectangle is its width times its height. "
)


def corpus(n: int = 20000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    ops = [("+", "plus", operator.add), ("-", "minus", operator.sub), ("*", "times", operator.mul)]
    lines = [PARAGRAPH] * 50
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        sym, word, f = rng.choice(ops)
        lines.append(
            f"What is {a} {sym} {b}? {a} {word} {b} equals {f(a, b)}. The answer is \\boxed{{{f(a, b)}}}."
        )
    return lines


def build(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                      "normalized": False, "single_word": False}
            for t in SPECIAL_TOKENS
        },
        "chat_template": CHAT_TEMPLATE,
    }  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{out}: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    default = Path(__file__).resolve().parents[3] / "fixtures" / "tokenizer"
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
