#!/usr/bin/env bash
# The whole one-GPU nvidia suite on one H200, junit kept. The plugin prepares the checkpoints side by side
# as pytest starts (`--prepare-ahead`; a run whose checkpoint is still being written waits on the cache's
# lock, then finds it built); on a machine that has them this costs nothing. fla's kernels come from
# .gpu-tree/triton.tgz.* (bench/gpu_h200_warm.sh's output, carried in) when present, else are compiled from
# the shipped configs. Each phase's seconds go to OUT_DIR/pytest.txt; env.txt is written after the suite.
#   bench/gpu_h200_suite.sh OUT_DIR [PYTEST_ARGS...]
set -uo pipefail
out=${1:?OUT_DIR}; shift
t0=$(date +%s) start_s=$(date +%s)
. bench/gpu_h200_setup.sh
mkdir -p "$out"
if [ ! -d "$RLSMOKE_CACHE/triton" ] && ls .gpu-tree/triton.tgz.* > /dev/null 2>&1; then
  mkdir -p "$RLSMOKE_CACHE" && cat .gpu-tree/triton.tgz.* | tar xzf - -C "$RLSMOKE_CACHE"
fi
echo "setup (wheels, rlsmoke, Triton cache): $(( $(date +%s) - t0 )) s" | tee "$out/pytest.txt"
t0=$(date +%s)
plugin=(); python3 -m pip show rlsmoke > /dev/null 2>&1 || plugin=(-p rlsmoke.pytest_plugin)
NUM_GPUS=1 python3 -m pytest "${plugin[@]}" -m nvidia tests/e2e -rs --durations=0 --junitxml "$out/junit-nvidia.xml" \
  "$@" >> "$out/pytest.txt" 2>&1; rc=$?
pytest_s=$(( $(date +%s) - t0 ))
for log in artifacts/prepare-ahead/*.log; do  # when each of this session's builds ended (its log's last write)
  [ -f "$log" ] && [ "$(stat -c %Y "$log")" -ge "$t0" ] && echo "checkpoint $(basename "$log" .log) ready $(( $(stat -c %Y "$log") - t0 )) s after pytest's start"
done | tee "$out/prepare.txt" >> "$out/pytest.txt"
echo "pytest, checkpoints prepared beside it: $pytest_s s wall, exit $rc" | tee -a "$out/pytest.txt"
# the fresh host's figure (docs/benchmarks.md): the wheels, the checkpoints and the suite, not the evidence below
echo "wheels, checkpoints and suite: $(( $(date +%s) - start_s )) s in all" | tee -a "$out/pytest.txt"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, transformers, sys; print(torch.__version__, transformers.__version__, sys.version)'
  python3 -c 'import fla, triton; print("fla", fla.__version__, "triton", triton.__version__)'; date; } > "$out/env.txt" 2>&1
tar czf "$out/artifacts.tgz" --exclude '*.safetensors' artifacts 2>/dev/null
