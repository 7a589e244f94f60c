"""Miles' converter alone, for the case and folders of a `rlsmoke run ... --launcher miles --train-only`:
the HF checkpoint prepared, then HF -> torch_dist, as the run's first steps do. A run after it finds the
torch_dist checkpoint made and skips the step, so a GPU host can convert while it waits for something else.
    python3 bench/miles_convert.py CASE --launcher miles --train-only --miles-root R --model-dir D ..."""

import sys

from rlsmoke.cli import build_parser
from rlsmoke.processes.train_only import convert, plan_of_args, prepare_hf

args = build_parser().parse_args(["run", *sys.argv[1:]])
tp = plan_of_args(args, "nvidia")
prepare_hf(tp)
failed = convert(tp)
print("convert: done" if failed is None else failed.tail(20))
sys.exit(0 if failed is None else 1)
