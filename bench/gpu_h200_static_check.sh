#!/usr/bin/env bash
# On the host where bench/gpu_h200_static_keys.sh just ran: its keys calibrated into this checkout's
# thresholds (as `rlsmoke calibrate` writes them here from the same runs), GLM-5 1-GPU `--repeat 10` with each
# trainer, the capture now at the load, then `NUM_GPUS=1 pytest -m nvidia tests/e2e` twice, the second warm.
#   bench/gpu_h200_static_check.sh KEYS_DIR OUT_DIR
set -uo pipefail
keys=${1:?KEYS_DIR} out=${2:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
for r in "$keys"/runs/*/; do rlsmoke calibrate "$r" --write fixtures/thresholds/builtin.json; done > "$out/calibrate.txt" 2>&1
steps_out=$out budget=${BUDGET_S:-560} start=$(date +%s)
. bench/steps.sh
glm5=glm5-744b-a40b-4layer-1gpu
for trainer in fsdp megatron; do
  timed "$trainer-0" timeout 150 rlsmoke run $glm5 --platform nvidia --num-gpus 1 --trainer $trainer --repeat 10 \
    --seed 0 --out "$out/runs/$trainer-0"
done
python3 bench/seed_cost_table.py "$out"/runs/*/ > "$out/seed-costs.md" 2>&1
for pass in first warm; do
  timed "suite-$pass" bash bench/gpu_h200_suite.sh "$out/suite-$pass"
done
cat "$out/timing.txt" "$out/seed-costs.md"; tail -3 "$out"/suite-*/pytest.txt
