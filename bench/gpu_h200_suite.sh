#!/usr/bin/env bash
# The whole one-GPU nvidia suite on one H200, junit kept, with a warm checkpoint cache and a warm Triton
# cache: on a machine where bench/gpu_h200_warm.sh ran both are there; on a fresh one the checkpoints are
# prepared first (not timed) and fla's kernels are unpacked from .gpu-tree/triton.tgz.* (that script's
# output, carried in) when present.
#   [CASES='case ...'] bench/gpu_h200_suite.sh OUT_DIR [PYTEST_ARGS...]   (CASES: the checkpoints to prepare)
set -uo pipefail
out=${1:?OUT_DIR}; shift
. bench/gpu_h200_setup.sh
mkdir -p "$out"
if [ ! -d "$RLSMOKE_CACHE/triton" ] && ls .gpu-tree/triton.tgz.* > /dev/null 2>&1; then
  mkdir -p "$RLSMOKE_CACHE" && cat .gpu-tree/triton.tgz.* | tar xzf - -C "$RLSMOKE_CACHE"
fi
t0=$(date +%s)
for c in ${CASES:-glm5-744b-a40b-4layer-1gpu glm4.5-355b-a32b-4layer glm5.3-flash-4layer-1gpu}; do
  rlsmoke prepare "$c" > /dev/null 2>&1 &
done
wait
echo "checkpoints ready: $(( $(date +%s) - t0 )) s" | tee "$out/pytest.txt"
plugin=(); python3 -m pip show rlsmoke > /dev/null 2>&1 || plugin=(-p rlsmoke.pytest_plugin)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, transformers, sys; print(torch.__version__, transformers.__version__, sys.version)'
  python3 -c 'import fla, triton; print("fla", fla.__version__, "triton", triton.__version__)'; date; } > "$out/env.txt" 2>&1
t0=$(date +%s)
NUM_GPUS=1 python3 -m pytest "${plugin[@]}" -m nvidia tests/e2e -rs --durations=0 --junitxml "$out/junit-nvidia.xml" \
  "$@" >> "$out/pytest.txt" 2>&1; rc=$?
echo "pytest: $(( $(date +%s) - t0 )) s wall, exit $rc" | tee -a "$out/pytest.txt"
tar czf "$out/artifacts.tgz" --exclude '*.safetensors' artifacts 2>/dev/null
