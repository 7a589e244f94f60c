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
    python3 - "$out/$name/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    line = json.loads(line)
    if line["kind"] == "step":
        m = line["metrics"]
        print(f"  seed {line.get('repeat', 0)} step {line['index']}: abs_diff {m['train/train_rollout_logprob_abs_diff']:.4f}"
              f"  kl {m['train/train_rollout_kl']:.4f}  max {m['train/train_rollout_logprob_abs_diff_max']:.3f}")
    else:  # the signed mean diff, as rlsmoke.metrics derives it
        m = line["metrics"]
        print(f"  seed {line.get('repeat', 0)} rollout {line['index']}: mean diff "
              f"{m['rollout/log_probs'] - m['rollout/rollout_log_probs']:+.4f}")
PY
  done
done
