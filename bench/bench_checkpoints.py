"""Benchmark: synthesize a full-width checkpoint, compare with a `dd` write of the same size, then FP8.

Synthesis runs twice: without and with the sha256 manifest (the default).

    python bench/bench_checkpoints.py --dir /tmp/rlsmoke-bench [--case glm5-744b-a40b-4layer] [--no-fp8]

Writes into --dir (same disk for dd and synthesis), prints one JSON line of figures, and deletes
everything it wrote. Refuses to start if the run would leave less than --keep-free-gb free.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rlsmoke.checkpoints import fp8, synthesize, verify
from rlsmoke.checkpoints.synthesis import synth_bytes
from rlsmoke.models import model_spec

DD_BLOCK = 64 * 2**20


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def dd_write(path: Path, nbytes: int) -> float:
    """Seconds for dd to write nbytes of zeros through the page cache, fsync'd like our shards."""
    t = time.perf_counter()
    subprocess.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={path}",
            f"bs={DD_BLOCK}",
            f"count={-(-nbytes // DD_BLOCK)}",
            "conv=fsync",
        ],
        check=True,
        capture_output=True,
    )
    dt = time.perf_counter() - t
    path.unlink()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--case", default="glm5-744b-a40b-4layer")
    ap.add_argument("--no-fp8", action="store_true")
    ap.add_argument("--keep-free-gb", type=float, default=20.0)
    args = ap.parse_args()

    spec = model_spec(args.case)
    size = synth_bytes(spec)
    need = size * (1.5 if not args.no_fp8 else 1.0) + args.keep_free_gb * 1e9
    args.dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    if free < need:
        sys.exit(
            f"{args.dir}: {free / 1e9:.1f} GB free, this run needs {need / 1e9:.1f} GB (incl. --keep-free-gb)"
        )

    bf16, f8 = args.dir / "bf16", args.dir / "fp8"
    res: dict = {"case": args.case, "bytes": size, "machine": f"{platform.node()} {platform.machine()}"}
    try:
        res["dd_s"] = dd_write(args.dir / "dd.bin", size)
        # Without the sha256 manifest first (then deleted), to show what hashing costs on top.
        t = time.perf_counter()
        synthesize(spec, bf16, manifest=False)
        res["synth_no_manifest_s"] = time.perf_counter() - t
        shutil.rmtree(bf16)
        t = time.perf_counter()
        synthesize(spec, bf16)
        res["synth_s"] = time.perf_counter() - t
        res["synth_peak_rss_gb"] = peak_rss_gb()
        res["ratio_vs_dd"] = res["dd_s"] / res["synth_s"]
        res["ratio_vs_dd_no_manifest"] = res["dd_s"] / res["synth_no_manifest_s"]
        t = time.perf_counter()
        verify(bf16)
        res["verify_sha256_s"] = time.perf_counter() - t
        if not args.no_fp8:
            t = time.perf_counter()
            fp8(bf16, f8)
            res["fp8_s"] = time.perf_counter() - t
            res["fp8_in_gbps"] = size / res["fp8_s"] / 1e9
            res["fp8_bytes"] = sum(p.stat().st_size for p in f8.glob("*.safetensors"))
            res["fp8_peak_rss_gb"] = peak_rss_gb()
    finally:
        shutil.rmtree(bf16, ignore_errors=True)
        shutil.rmtree(f8, ignore_errors=True)
    res["dd_gbps"] = size / res["dd_s"] / 1e9
    res["synth_gbps"] = size / res["synth_s"] / 1e9
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}))


if __name__ == "__main__":
    main()
