"""The data rlsmoke needs at run time; `_fixtures` links to the checkout's `fixtures/`, a wheel copies it."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "_fixtures"
RUNTIME_FOLDERS = ("thresholds", "data", "tokenizer", "fla_configs")
