"""Benchmark: what checking a checkpoint on every use costs (`rlsmoke.checkpoints.identity`).

Synthesizes the case's checkpoint into --dir (or reuses the one there), then times, each once:

- identity: config.json against the case's spec;
- headers: `verify(checksums=False)`, what every use did before (headers, lengths, config.json);
- sha256 first use: every shard hashed against the manifest (a first use, or a changed file); the
  shards were just written, so from the page cache (sha256's own speed) unless --drop-caches (root;
  it empties the page cache of the whole host, so only on a machine of your own);
- sha256 stamped: the next use, every stamp valid (a stat per shard);
- one shard changed: its stamp invalid, that shard hashed again.

    python bench/bench_checkpoint_integrity.py --dir /tmp/rlsmoke-integrity [--case glm5-744b-a40b-4layer] [--tiny]

Prints one JSON line. Deletes what it wrote unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from rlsmoke.checkpoints import synthesize, verify
from rlsmoke.checkpoints.identity import check_checksums, check_identity
from rlsmoke.models import model_spec


def timed(call, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = call(*args, **kwargs)
    return time.perf_counter() - start, result


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--case", default="glm5-744b-a40b-4layer")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--drop-caches", action="store_true", help="time the first use from the disk (root)")
    args = ap.parse_args()
    spec = model_spec(args.case, tiny=args.tiny)
    ckpt = args.dir / f"{args.case}-{spec.width}"
    made = not (ckpt / "config.json").is_file()
    if made:
        synthesize(spec, ckpt)
    stamps = Path(tempfile.mkdtemp(prefix="rlsmoke-stamps-"))
    try:
        shards = sorted(ckpt.glob("*.safetensors"))
        nbytes = sum(p.stat().st_size for p in shards)
        identity_s, _ = timed(check_identity, ckpt, spec)
        headers_s, _ = timed(verify, ckpt, checksums=False)
        cold = args.drop_caches and drop_page_cache()
        cold_s, hashed = timed(check_checksums, ckpt, cache_dir=stamps)
        stamped_s, rehashed = timed(check_checksums, ckpt, cache_dir=stamps)
        os.utime(shards[0])  # a write would move its mtime too
        changed_s, changed_bytes = timed(check_checksums, ckpt, cache_dir=stamps)
    finally:
        shutil.rmtree(stamps, ignore_errors=True)
        if made and not args.keep:
            shutil.rmtree(ckpt, ignore_errors=True)
    print(json.dumps({
        "case": args.case, "width": spec.width, "shards": len(shards), "gb": round(nbytes / 1e9, 2),
        "identity_s": round(identity_s, 4), "headers_s": round(headers_s, 3),
        "sha256_cold_s": round(cold_s, 2), "page_cache_dropped": cold, "hashed_gb": round(hashed / 1e9, 2),
        "sha256_gb_per_s": round(hashed / 1e9 / cold_s, 2) if cold_s else None,
        "sha256_stamped_s": round(stamped_s, 4), "rehashed_bytes": rehashed,
        "one_shard_changed_s": round(changed_s, 2), "one_shard_gb": round(changed_bytes / 1e9, 2),
        "host": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
