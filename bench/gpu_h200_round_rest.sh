#!/usr/bin/env bash
# The static round's second call, on the same warm H200 (its caches and checkpoints kept; the thresholds as
# the first call's `calibrate` wrote them, copied back here first): the newly calibrated key (`CHECK`,
# default GLM-4.5 4-layer with the megatron trainer) against ten seeds it never saw (100-109) and the
# one-sided temperature of 0.95 on five (200-204); then, while the budget lasts, both tiny widths calibrated
# anew from ten static seeds, and a megatron seed under torch.profiler. (At 6e61c33: `CHECK=flash`, then
# GLM-4.5's fsdp key calibrated and the tiny widths run against their old keys.)
#   [BUDGET_S=570] [CHECK=flash] bench/gpu_h200_round_rest.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570} start=$(date +%s)
. bench/steps.sh
check=${CHECK:-glm45-megatron} glm5=glm5-744b-a40b-4layer-1gpu
one=(--platform nvidia --num-gpus 1)
timed "$check-100" timeout 170 rlsmoke run ${KEY_RUNS[$check]} "${one[@]}" --repeat 10 --seed 100 --out "$out/runs/$check-100"
timed "$check-twin-t095" timeout 110 rlsmoke run ${KEY_RUNS[$check]} "${one[@]}" --repeat 5 --seed 200 \
  --inject temperature-mismatch --rollout-temperature 0.95 --out "$out/runs/$check-twin-t095"
for c in glm5-744b-a40b-4layer glm4.5-355b-a32b-4layer; do  # the tiny widths' keys from static seeds
  [ "$(left)" -gt 60 ] && timed "${c%%-*}-tiny" timeout $(( $(left) - 5 )) rlsmoke run $c "${one[@]}" --tiny --repeat 10 \
    --seed 0 --rollout-decode static --out "$out/runs/${c%%-*}-tiny" && timed "calibrate-${c%%-*}-tiny" \
    rlsmoke calibrate "$out/runs/${c%%-*}-tiny" --write fixtures/thresholds/builtin.json
done
[ "$(left)" -gt 100 ] && timed megatron-profile timeout 120 python3 bench/gpu_seed_profile.py $glm5 --trainer megatron \
  --out "$out/profile"  # where megatron's further seed goes over fsdp's
runs_report "$out"
