#!/usr/bin/env bash
# How far the log-prob gates see a temperature mismatch on a GPU case: at each rollout temperature,
# a clean run and an `--inject temperature-mismatch` run over the same seeds (so the same samples).
#   bench/gpu_temperature_sweep.sh OUT_DIR TEMPERATURE...      (env CASE, SEEDS; default 2 seeds)
set -uo pipefail
out=${1:?OUT_DIR}; shift
case_name=${CASE:-glm5-744b-a40b-4layer-1gpu}
seeds=${SEEDS:-2}
mkdir -p "$out"
for t in "$@"; do
  for inject in none temperature-mismatch; do
    name="t$t-$inject"
    args=(); [ "$inject" = none ] || args=(--inject "$inject")
    t0=$(date +%s)
    rlsmoke run "$case_name" --platform nvidia --num-gpus 1 --rollout-temperature "$t" --repeat "$seeds" \
      "${args[@]}" --out "$out/$name" > "$out/$name.txt" 2>&1
    rc=$?
    echo "$name: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
    python3 - "$out/$name" <<'PY'
import sys
from rlsmoke.metrics import seed_records
from rlsmoke.metrics import MEAN_DIFF
for seed, record in enumerate(seed_records(sys.argv[1])):  # one record per --repeat seed
    for metric in (MEAN_DIFF, "train/train_rollout_logprob_abs_diff", "train/train_rollout_kl"):
        print(f"  seed {seed} {metric}: " + " ".join(f"{v:+.4f}" for _, _, v in record.series(metric)))
PY
  done
done
