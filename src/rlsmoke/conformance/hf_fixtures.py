"""Write `fixtures/hf_configs/<model>/config.json` for every model: the `--hf-checkpoint` of the real parsers.

    python -m rlsmoke.conformance.hf_fixtures [--check]

Full width, config only; `--check` fails if a committed file differs. Runs in a conformance venv.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rlsmoke.models import MODEL_NAMES, model_spec

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "hf_configs"
# Written by transformers but not part of the model: they would make the files churn across versions.
_VOLATILE = ("transformers_version", "_name_or_path", "dtype", "torch_dtype")


def render(name: str) -> str:
    """The config.json text of one model at full width."""
    from rlsmoke.models.hf import hf_config

    data = hf_config(model_spec(name)).to_dict()
    for part in (data, data.get("text_config")):
        if isinstance(part, dict):
            for key in _VOLATILE:
                part.pop(key, None)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def fixture_dir(name: str) -> Path:
    return Path(os.environ.get("RLSMOKE_HF_CONFIGS", FIXTURES)) / name


def checkpoint_for(model: str, rendered: str | None) -> str:
    """The rendered folder where it has a config.json, else this repo's fixture for the model."""
    if rendered and (Path(rendered) / "config.json").is_file():
        return rendered
    folder = fixture_dir(model)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"model={model!r} has no config.json at {rendered!r} nor at {folder}. "
            "Adjust: run `python -m rlsmoke.conformance.hf_fixtures`."
        )
    return str(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed config.json is stale")
    args = parser.parse_args(argv)
    stale = []
    for name in MODEL_NAMES:
        path = fixture_dir(name) / "config.json"
        text = render(name)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print(
            "stale HF config fixtures (run `python -m rlsmoke.conformance.hf_fixtures`):", *stale, sep="\n  "
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
