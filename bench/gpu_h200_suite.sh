#!/usr/bin/env bash
# The whole one-GPU nvidia suite on one H200, junit kept. Run it where bench/gpu_h200_flash.sh ran (or
# after one Flash run): the checkpoints and fla's Triton cache are warm then.
#   bench/gpu_h200_suite.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out"
plugin=(); python3 -m pip show rlsmoke > /dev/null 2>&1 || plugin=(-p rlsmoke.pytest_plugin)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date; } > "$out/env.txt" 2>&1
t0=$(date +%s)
NUM_GPUS=1 python3 -m pytest "${plugin[@]}" -m nvidia tests/e2e -rs --durations=0 --junitxml "$out/junit-nvidia.xml" \
  > "$out/pytest.txt" 2>&1; rc=$?
echo "pytest: $(( $(date +%s) - t0 )) s wall, exit $rc" | tee -a "$out/pytest.txt"
tar czf "$out/artifacts.tgz" --exclude '*.safetensors' artifacts 2>/dev/null
