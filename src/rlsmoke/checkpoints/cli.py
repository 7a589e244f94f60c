"""`rlsmoke prepare` and `rlsmoke verify`; heavy imports stay inside the handlers so `--help` is fast."""

from __future__ import annotations

import argparse
import re
import sys

from rlsmoke.errors import CheckpointError, ExitCode

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9, '512MiB' -> 2**29, '1000' -> 1000 (HF's decimal units)."""
    if not (m := _SIZE.match(text.strip())):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 5GB, 512MiB or 1000000")
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower().rstrip("b")])
    if size < 1:  # a 0 would otherwise fall back to the 5GB default without a word
        raise argparse.ArgumentTypeError(
            f"{text!r} is less than one byte: a shard holds at least one tensor byte"
        )
    return size


def register(subparsers) -> None:
    from rlsmoke.cases import add_case_arg, add_tiny_arg
    from rlsmoke.checkpoints.dialects import DIALECTS

    p = subparsers.add_parser(
        "prepare", help="synthesize, prune, patch or FP8-convert a checkpoint, then verify it"
    )
    add_case_arg(p)
    p.add_argument("--out", help="output folder (default: the cache, keyed by case, width, seed, dialect)")
    add_tiny_arg(p, "off: the full width")
    p.add_argument("--seed", type=int, default=0, help="initialization seed (default 0)")
    p.add_argument(
        "--dialect", choices=DIALECTS, help="GLM-5 config dialect: deepseek_v32 (older Miles) or native"
    )
    p.add_argument("--fp8", action="store_true", help="also convert to Miles' block FP8 (rollout weights)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prune-from", metavar="DIR", help="prune this real HF checkpoint instead of synthesizing"
    )
    src.add_argument("--from-hub", metavar="ID", help="download ID with huggingface_hub, then prune it")
    p.add_argument("--keep-mtp", action="store_true", help="keep the MTP layers when pruning (default: drop)")
    p.add_argument(
        "--dtype", choices=("bf16", "fp32"), default="bf16", help="synthesized dtype (default bf16)"
    )
    p.add_argument(
        "--max-shard-size", type=parse_size, default="5GB", help="largest shard file (default 5GB)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=prepare_handler)

    v = subparsers.add_parser("verify", help="check a checkpoint folder: shards, index, config, checksums")
    v.add_argument("dir", metavar="DIR", help="checkpoint folder")
    v.add_argument(
        "--dialect", choices=DIALECTS, help="also report what this GLM-5 dialect's Miles would reject"
    )
    v.add_argument("--no-checksums", action="store_true", help="skip the sha256 manifest (fast)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.set_defaults(func=verify_handler)


def prepare_handler(args: argparse.Namespace) -> int:
    from rlsmoke.checkpoints.cache import prepare, prepare_to
    from rlsmoke.models import model_spec

    model_spec(args.case)  # an unknown case: the named error before anything else
    # `say` to stderr: stdout is the folder alone, for scripts
    both = dict(tiny=bool(args.tiny), seed=args.seed, dialect=args.dialect, fp8=args.fp8,
                progress=not args.no_progress, say=lambda line: print(line, file=sys.stderr, flush=True))  # fmt: skip
    if args.out is None:
        if args.prune_from or args.from_hub or args.keep_mtp or args.dtype != "bf16" or args.force:
            raise CheckpointError(
                "--prune-from, --from-hub, --keep-mtp, --dtype and --force need --out",
                rule="prepare.out",
                fix="pass --out DIR, or drop them to use the cache",
            )
        path = prepare(args.case, **both)
    else:
        path = prepare_to(args.out, args.case, **both, prune_from=args.prune_from, from_hub=args.from_hub,
                          keep_mtp=args.keep_mtp, dtype=args.dtype, max_shard_bytes=args.max_shard_size,
                          force=args.force)  # fmt: skip
    print(path)
    return ExitCode.OK


def verify_handler(args: argparse.Namespace) -> int:
    from rlsmoke.checkpoints.verification import verify
    from rlsmoke.paths import check_name

    check_name(args.dir, "DIR")  # too long a name is its own line; a missing folder is verify's
    rep = verify(
        args.dir, checksums=not args.no_checksums, dialect=args.dialect, progress=not args.no_progress
    )
    sums = "sha256 ok" if rep.checksummed else "no sha256 manifest checked"
    print(
        f"{rep.folder}: ok, {len(rep.shards)} shards, {rep.tensors} tensors, {rep.nbytes / 1e9:.3f} GB, {sums}"
    )
    return ExitCode.OK
