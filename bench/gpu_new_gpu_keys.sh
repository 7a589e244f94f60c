#!/usr/bin/env bash
# A GPU that no shipped key names (a B200, say), as a user meets it: ten seeds of the case on this GPU, a
# key calibrated from them, then the case's e2e module (the clean step and its twins) gated by that key.
#   bench/gpu_new_gpu_keys.sh OUT_DIR [TEST_FILE]
set -uo pipefail
out=${1:?OUT_DIR}; tests=${2:-tests/e2e/test_glm5_744b_a40b_4layer_nvidia.py}
. bench/gpu_h200_setup.sh
case=$(python3 bench/suite_cases.py "$tests")  # the module's case at one GPU
mkdir -p "$out" /root/new-gpu-keys
steps_out=$out budget=${BUDGET_S:-3000} start=$(date +%s)
. bench/steps.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/env.txt"
timed prepare rlsmoke prepare "$case"
# no key yet: the run records its seeds, then says which key is missing (exit 2)
timed repeat rlsmoke run "$case" --platform nvidia --num-gpus 1 --repeat 10 --seed 100 --out /root/new-gpu-seeds
grep -q '\[memory.fits\]' "$out/repeat.txt" && { cat "$out/repeat.txt"; exit 2; }  # this GPU is too small
timed calibrate rlsmoke calibrate /root/new-gpu-seeds --write /root/new-gpu-keys/keys.json
cp /root/new-gpu-keys/keys.json "$out/" 2>/dev/null
plugin=(); python3 -m pip show rlsmoke > /dev/null 2>&1 || plugin=(-p rlsmoke.pytest_plugin)
timed suite env RLSMOKE_THRESHOLDS_DIR=/root/new-gpu-keys NUM_GPUS=1 timeout "$(left)" python3 -m pytest "${plugin[@]}" \
  -m nvidia "$tests" -rs --junitxml "$out/junit.xml"
tail -n 3 "$out"/{repeat,calibrate}.txt; tail -n 15 "$out/suite.txt"; cat "$out/timing.txt"
