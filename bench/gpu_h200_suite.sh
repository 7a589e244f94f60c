#!/usr/bin/env bash
# The whole one-GPU nvidia suite on one H200, junit kept; the Flash key from bench/gpu_h200_flash.sh when
# this machine ran it (the checkpoints and the Triton cache it left are warm then).
#   bench/gpu_h200_suite.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out"
[ -f /root/runs/builtin.json ] && cp /root/runs/builtin.json fixtures/thresholds/builtin.json
plugin=(); python3 -m pip show rlsmoke > /dev/null 2>&1 || plugin=(-p rlsmoke.pytest_plugin)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; date; } > "$out/env.txt" 2>&1
t0=$(date +%s)
NUM_GPUS=1 python3 -m pytest "${plugin[@]}" -m nvidia tests/e2e -rs --durations=0 --junitxml "$out/junit-nvidia.xml" \
  > "$out/pytest.txt" 2>&1; rc=$?
echo "pytest: $(( $(date +%s) - t0 )) s wall, exit $rc" | tee -a "$out/pytest.txt"
tar czf "$out/artifacts.tgz" --exclude '*.safetensors' artifacts 2>/dev/null
