#!/usr/bin/env bash
# Calibrate the one-GPU case on a GPU host: a cold time-to-verdict run (checkpoint synthesis
# included), then batches of 3 seeds while the time budget lasts. Each batch is one process
# (`--repeat 3`), so a batch that is cut short loses only itself.
#   bench/gpu_calibrate.sh OUT_DIR [BUDGET_S]
# then, where the checkout is: rlsmoke calibrate OUT_DIR/seed* --write fixtures/thresholds/builtin.json
set -uo pipefail
out=${1:?OUT_DIR}; budget=${2:-480}
case_name=${CASE:-glm5-744b-a40b-4layer-1gpu}
mkdir -p "$out"
start=$(date +%s)
t0=$(date +%s)
rlsmoke run "$case_name" --platform nvidia --num-gpus 1 --seed 0 --out "$out/seed0" > "$out/seed0.txt" 2>&1
rc=$?
echo "cold time to verdict (prepare included): $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
tail -15 "$out/seed0.txt"
seed=1
last=$(( $(date +%s) - t0 ))  # a batch of 3 takes about 3x a seed: start one only if it can finish
while [ $(( $(date +%s) - start + 3 * last )) -le "$budget" ] && [ $seed -lt 10 ]; do
  t0=$(date +%s)
  rlsmoke run "$case_name" --platform nvidia --num-gpus 1 --seed $seed --repeat 3 --out "$out/seeds$seed" \
    > "$out/seeds$seed.txt" 2>&1
  rc=$?
  echo "seeds $seed-$((seed + 2)): $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
  last=$(( ($(date +%s) - t0) / 3 ))
  seed=$((seed + 3))
done
