#!/usr/bin/env bash
# The one-GPU nvidia suite twice on one fresh H200, junit kept each time: first from nothing (the
# checkpoints prepared, fla's kernels compiled from the shipped configs), then warm (both cached).
#   bench/gpu_h200_fresh_and_warm.sh OUT_DIR [PYTEST_ARGS...]
set -uo pipefail
out=${1:?OUT_DIR}; shift
t0=$(date +%s)
bash bench/gpu_h200_suite.sh "$out/fresh" "$@"
echo "fresh machine, the suite script with its evidence (env.txt, artifacts.tgz): $(( $(date +%s) - t0 )) s" | tee -a "$out/fresh/pytest.txt"
bash bench/gpu_h200_suite.sh "$out/warm" "$@"
