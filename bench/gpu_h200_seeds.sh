#!/usr/bin/env bash
# GLM-5 4-layer's seeds on one H200, each trainer: seeds 0-9 and ten seeds no key saw (100-109), each batch one
# process (`--repeat 10`), and the one-sided temperature of 0.95 on five seeds; then three Flash seeds. Each
# batch's gates decide its exit; the seconds per seed and the load come from the runs' summaries.
#   [DECODE=static] [BUDGET_S=570] bench/gpu_h200_seeds.sh OUT_DIR   (DECODE: --rollout-decode; unset, the default)
# A host that returns few files: give an OUT_DIR outside the returned folder and pack it there.
# Figures: OUT_DIR/timing.txt (each batch), OUT_DIR/seed-costs.md (bench/seed_cost_table.py), the verdicts.
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
if ! python3 -c 'import megatron.core' 2> /dev/null; then  # half the batches would stop at their first line
  echo "error: [bench.wheels] megatron-core is not importable; fix: put its cp312 wheel in .whl/ (bench/gpu_h200_setup.sh)"
  exit 2
fi
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570} start=$(date +%s)
. bench/steps.sh
glm5=glm5-744b-a40b-4layer-1gpu
one=(--platform nvidia --num-gpus 1 ${DECODE:+--rollout-decode "$DECODE"})
timed prepare rlsmoke prepare $glm5
for trainer in fsdp megatron; do
  for first in 0 100; do
    timed "$trainer-$first" timeout $(( $(left) - 20 )) rlsmoke run $glm5 "${one[@]}" --trainer $trainer --repeat 10 \
      --seed $first --out "$out/runs/$trainer-$first"
  done
  timed "$trainer-twin-t095" timeout $(( $(left) - 20 )) rlsmoke run $glm5 "${one[@]}" --trainer $trainer --repeat 5 \
    --seed 200 --inject temperature-mismatch --rollout-temperature 0.95 --out "$out/runs/$trainer-twin-t095"
done
timed flash timeout $(( $(left) - 5 )) rlsmoke run glm5.3-flash-4layer-1gpu "${one[@]}" --repeat 3 --seed 20 \
  --out "$out/runs/flash"
runs_report "$out"
