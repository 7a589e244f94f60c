#!/usr/bin/env bash
# The temperature twin against the clean run, seed by seed, through the whole engine on one GPU:
# batches of clean runs (the suite's defaults: the calibration runs) and of twin runs (seed 000's
# rollout temperature with the temperature on one side only), alternating, while the budget lasts.
# A batch is one process (`--repeat`), so one cut short loses only itself.
#   bench/gpu_twin_table.sh OUT_DIR [BUDGET_S] [FIRST_SEED] [LAST_SEED]   (env CASE, BATCH, TEMPERATURE, KINDS, PER_SEED)
# then: python bench/twin_table.py OUT_DIR/clean* OUT_DIR/twin*   (the per-seed table)
#       rlsmoke calibrate OUT_DIR/clean* --write src/rlsmoke/_fixtures/thresholds/builtin.json
set -uo pipefail
out=${1:?OUT_DIR}; budget=${2:-540}; first=${3:-0}; last=${4:-9}
case_name=${CASE:-glm5-744b-a40b-4layer-1gpu}
batch=${BATCH:-5}
temperature=${TEMPERATURE:-0.8}
kinds=${KINDS:-clean twin}  # KINDS=twin: the twin seeds only
mkdir -p "$out"
start=$(date +%s)
per_seed=${PER_SEED:-60}  # until measured (a cold checkpoint adds about 35 s to the first batch)
seed=$first
while [ "$seed" -le "$last" ]; do
  n=$(( last - seed + 1 < batch ? last - seed + 1 : batch ))
  for kind in $kinds; do
    if [ $(( $(date +%s) - start + n * per_seed )) -gt "$budget" ]; then
      echo "budget: stopped before $kind seeds $seed-$((seed + n - 1))" | tee -a "$out/timing.txt"
      exit 0
    fi
    args=(); [ "$kind" = twin ] && args=(--inject temperature-mismatch --rollout-temperature "$temperature")
    name="$kind$seed"
    t0=$(date +%s)
    rlsmoke run "$case_name" --platform nvidia --num-gpus 1 --seed "$seed" --repeat "$n" "${args[@]}" \
      --out "$out/$name" > "$out/$name.txt" 2>&1
    rc=$?
    took=$(( $(date +%s) - t0 ))
    echo "$kind seeds $seed-$((seed + n - 1)): $took s, exit $rc" | tee -a "$out/timing.txt"
    tail -16 "$out/$name.txt"
    per_seed=$(( took / n + 1 ))
  done
  seed=$(( seed + n ))
done
