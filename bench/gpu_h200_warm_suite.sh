#!/usr/bin/env bash
# The one-GPU nvidia suite with warm caches, on a fresh H200, in one short command: the three checkpoints
# prepared and fla's kernels compiled by one Flash seed first (not timed), then the suite, junit kept.
#   bench/gpu_h200_warm_suite.sh OUT_DIR [PYTEST_ARGS...]
set -uo pipefail
out=${1:?OUT_DIR}; shift
. bench/gpu_h200_setup.sh
t0=$(date +%s)
flash=glm5.3-flash-4layer-1gpu
for c in $SUITE_CASES; do [ "$c" = $flash ] || rlsmoke prepare "$c" > /dev/null 2>&1 & done
rlsmoke run $flash --platform nvidia --num-gpus 1 --seed 10 --out /root/runs/flash-compile > /dev/null 2>&1
echo "the Flash seed that compiled fla's kernels: exit $?"
wait
echo "caches warm (checkpoints, fla's kernels): $(( $(date +%s) - t0 )) s"
bash bench/gpu_h200_suite.sh "$out" "$@"
