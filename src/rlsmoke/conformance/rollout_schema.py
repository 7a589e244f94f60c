"""Records the schema of Miles' debug-rollout file (`launch.rollout_file.SCHEMA`) from Miles' own code:
`python -m rlsmoke.conformance.rollout_schema --record-schema MILES_ROOT`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rlsmoke.launch.rollout_file import SCHEMA, TEMPLATE_FIELD, load, path_for, schema_of

# Run with the checkout first on sys.path: Miles' own Sample, saved by Miles' own writer. Only torch and
# numpy are imported (debug_data's parquet sidecar is skipped when polars is missing, with a warning).
_RECORDER = """
import argparse, sys
from miles.ray.rollout.debug_data import save_debug_rollout_data
from miles.utils.types import Sample

sample = Sample(group_index=0, index=0, prompt="p", tokens=[1, 2, 3, 4], response="r", response_length=2,
                label="l", reward=0.5, loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.25],
                status=Sample.Status.COMPLETED)
sample.validate()
args = argparse.Namespace(save_debug_rollout_data=sys.argv[1], save_debug_trajectory_data=None)
save_debug_rollout_data(args, [sample], rollout_id=0, evaluation=False)
"""


def record_schema(miles_root: Path, python: str = sys.executable, commit: str | None = None) -> dict:
    """The schema of a file that Miles' own writer made from Miles' own `Sample` in the checkout at
    `miles_root` (its commit recorded with it)."""
    miles_root = Path(miles_root).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        template = f"{tmp}/rollout_data/{TEMPLATE_FIELD}.pt"
        env = {**os.environ, "PYTHONPATH": str(miles_root)}
        subprocess.run([python, "-c", _RECORDER, template], env=env, cwd=tmp, check=True, capture_output=True)
        schema = schema_of(load(path_for(template)))
    if commit is None:  # a checkout's own; an exported tree (git archive) has none and is told it
        head = subprocess.run(
            ["git", "-C", str(miles_root), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        commit = head.stdout.strip() or "unknown (not a git checkout)"
    return {"provenance": {"miles": commit,
                           "command": "python -m rlsmoke.conformance.rollout_schema --record-schema MILES_ROOT"
                                      f" --commit {commit}",
                           "how": "Miles' Sample(...).validate() saved by Miles' save_debug_rollout_data, then "
                                  "described by rlsmoke.launch.rollout_file.schema_of"},
            **schema}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsmoke.conformance.rollout_schema",
                                description="record Miles' debug-rollout file schema into " + str(SCHEMA))  # fmt: skip
    p.add_argument("--record-schema", metavar="MILES_ROOT", type=Path, required=True)
    p.add_argument("--commit", help="the checkout's Miles commit, when it is not a git checkout")
    p.add_argument("--out", type=Path, default=SCHEMA)
    args = p.parse_args(argv)
    schema = record_schema(args.record_schema, commit=args.commit)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(schema, indent=2) + "\n")
    print(
        f"recorded {len(schema['sample'])} sample fields from Miles {schema['provenance']['miles']} into {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
