"""The data rlsmoke needs at run time: the thresholds, the prompt set, the tokenizer and fla's kernel configs.

`_fixtures` beside this file links to the checkout's `fixtures/`; a wheel carries a copy of the
run-time folders under that name, so an installed rlsmoke needs no checkout.
"""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "_fixtures"
RUNTIME_FOLDERS = ("thresholds", "data", "tokenizer", "fla_configs")
