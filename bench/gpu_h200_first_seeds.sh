#!/usr/bin/env bash
# A short H200 round: GLM-5 1-GPU `--repeat 3` with each trainer (the first seed, the capture now at the
# load), then, with what the budget leaves, GLM-4.5 4-layer fsdp's static seeds for its key
# (`rlsmoke calibrate OUT_DIR/runs/glm45-fsdp --write fixtures/thresholds/builtin.json` where the checkout is).
#   [BUDGET_S=250] bench/gpu_h200_first_seeds.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-250} start=$(date +%s)
. bench/steps.sh
rlsmoke prepare glm4.5-355b-a32b-4layer > /dev/null 2>&1 &
for trainer in fsdp megatron; do
  timed "glm5-$trainer" timeout 90 rlsmoke run glm5-744b-a40b-4layer-1gpu --platform nvidia --num-gpus 1 \
    --trainer $trainer --repeat 3 --seed 0 --out "$out/runs/glm5-$trainer"
done
wait
[ "$(left)" -gt 60 ] && timed glm45-fsdp timeout $(( $(left) - 5 )) rlsmoke run glm4.5-355b-a32b-4layer \
  --platform nvidia --num-gpus 1 --repeat 10 --seed 0 --rollout-decode static --out "$out/runs/glm45-fsdp"
python3 bench/seed_cost_table.py "$out"/runs/*/ > "$out/seed-costs.md" 2>&1
for r in "$out"/runs/*/summary.json; do
  python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2], s['verdict'],
      s.get('per_repeat_verdict'), s.get('rollout_decode'), s['timing'].get('load_phases_s'))" "$r"
done > "$out/verdicts.txt" 2>&1
cat "$out/timing.txt" "$out/verdicts.txt" "$out/seed-costs.md"
