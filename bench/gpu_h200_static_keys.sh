#!/usr/bin/env bash
# The keys that the static decode (the GPU's choice under `--rollout-decode auto`) samples anew, on one H200,
# other than GLM-5 1-GPU's (bench/gpu_h200_seeds.sh): GLM-4.5 4-layer with each trainer, and both tiny
# widths; `--repeat 10` on seeds 0-9, one process a batch. The suite's checkpoints are prepared beside them.
#   [BUDGET_S=540] bench/gpu_h200_static_keys.sh OUT_DIR
# then: rlsmoke calibrate OUT_DIR/runs/X --write fixtures/thresholds/builtin.json, one run folder a key.
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-540} start=$(date +%s)
. bench/steps.sh
for c in $SUITE_CASES; do rlsmoke prepare "$c" > /dev/null 2>&1; done &
ten=(--platform nvidia --num-gpus 1 --repeat 10 --seed 0)
glm45=glm4.5-355b-a32b-4layer
for trainer in fsdp megatron; do
  timed "glm45-$trainer" timeout $(( $(left) - 60 )) rlsmoke run $glm45 "${ten[@]}" --trainer $trainer \
    --out "$out/runs/glm45-$trainer"
done
for c in glm5-744b-a40b-4layer $glm45; do
  timed "${c%%-*}-tiny" timeout $(( $(left) - 5 )) rlsmoke run $c "${ten[@]}" --tiny --out "$out/runs/${c%%-*}-tiny"
done
wait
python3 bench/seed_cost_table.py "$out"/runs/*/ > "$out/seed-costs.md" 2>&1
for r in "$out"/runs/*/summary.json; do
  python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2], s['verdict'],
      s.get('per_repeat_verdict'), s.get('rollout_decode'))" "$r"
done > "$out/verdicts.txt" 2>&1
cat "$out/timing.txt" "$out/verdicts.txt" "$out/seed-costs.md"
