#!/usr/bin/env bash
# The static decode (the GPU's choice under `--rollout-decode auto`) on one fresh H200, most needed first:
# GLM-4.5 4-layer fsdp `--repeat 10` on seeds 0-9 and its key calibrated into this checkout's thresholds (as
# `rlsmoke calibrate` then writes it here from the same runs); GLM-5 1-GPU `--repeat 3` with each trainer,
# the capture now at the load (fsdp, then megatron after the suite); `NUM_GPUS=1 pytest -m nvidia tests/e2e`,
# junit kept; then, while the budget lasts, the other keys' seeds: GLM-4.5 megatron and both tiny widths.
# The suite's checkpoints are prepared beside the first batch.
#   [BUDGET_S=570] bench/gpu_h200_static_round.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570} start=$(date +%s)
. bench/steps.sh
for c in $SUITE_CASES; do rlsmoke prepare "$c" > /dev/null 2>&1; done &
ten=(--platform nvidia --num-gpus 1 --repeat 10 --seed 0 --rollout-decode static)  # auto keeps generate until calibrated
glm45=glm4.5-355b-a32b-4layer glm5=glm5-744b-a40b-4layer-1gpu
timed glm45-fsdp timeout $(( $(left) - 150 )) rlsmoke run $glm45 "${ten[@]}" --out "$out/runs/glm45-fsdp"
timed calibrate rlsmoke calibrate "$out/runs/glm45-fsdp" --write fixtures/thresholds/builtin.json
wait
glm5_three() {  # glm5_three TRAINER: GLM-5 1-GPU's first seeds, auto's decode (static: its keys say so)
  timed "glm5-$1" timeout 90 rlsmoke run $glm5 --platform nvidia --num-gpus 1 --trainer "$1" --repeat 3 --seed 0 \
    --out "$out/runs/glm5-$1"
}
[ "$(left)" -gt 200 ] && glm5_three fsdp
timed suite timeout $(( $(left) - 5 )) bash bench/gpu_h200_suite.sh "$out/suite"
[ "$(left)" -gt 70 ] && glm5_three megatron
[ "$(left)" -gt 200 ] && timed glm45-megatron timeout $(( $(left) - 5 )) rlsmoke run $glm45 "${ten[@]}" \
  --trainer megatron --out "$out/runs/glm45-megatron"
for c in glm5-744b-a40b-4layer $glm45; do
  [ "$(left)" -gt 40 ] && timed "${c%%-*}-tiny" timeout $(( $(left) - 5 )) rlsmoke run $c "${ten[@]}" --tiny \
    --out "$out/runs/${c%%-*}-tiny"
done
python3 bench/seed_cost_table.py "$out"/runs/*/ > "$out/seed-costs.md" 2>&1
for r in "$out"/runs/*/summary.json; do
  python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2], s['verdict'],
      s.get('per_repeat_verdict'), s.get('rollout_decode'), s['timing'].get('load_phases_s'))" "$r"
done > "$out/verdicts.txt" 2>&1
cat "$out/timing.txt" "$out/verdicts.txt" "$out/seed-costs.md"; tail -4 "$out/suite/pytest.txt"
