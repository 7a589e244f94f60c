#!/usr/bin/env bash
# The static round's second call, on the same warm H200 (its caches and checkpoints kept; the thresholds as
# the first call left them, copied back here first): the keys still `generate`'s (`CALIBRATE`, default
# GLM-4.5 4-layer with the megatron trainer) calibrated anew from ten static seeds, then held to ten seeds
# they never saw and the one-sided temperature of 0.95; while the budget lasts, both tiny widths
# calibrated anew from ten static seeds, and a megatron seed under torch.profiler.
#   [BUDGET_S=570] [CALIBRATE="glm45-megatron ..."] bench/gpu_h200_round_rest.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570} start=$(date +%s)
. bench/steps.sh
one=(--platform nvidia --num-gpus 1)
for k in ${CALIBRATE:-glm45-megatron}; do
  [ "$(left)" -gt 120 ] && check_key "$k" 1
done
for c in glm5-744b-a40b-4layer glm4.5-355b-a32b-4layer; do  # the tiny widths' keys from static seeds
  [ "$(left)" -gt 60 ] && timed "${c%%-*}-tiny" timeout $(( $(left) - 5 )) rlsmoke run $c "${one[@]}" --tiny --repeat 10 \
    --seed 0 --rollout-decode static --out "$out/runs/${c%%-*}-tiny" && timed "calibrate-${c%%-*}-tiny" \
    rlsmoke calibrate "$out/runs/${c%%-*}-tiny" --write fixtures/thresholds/builtin.json
done
[ "$(left)" -gt 100 ] && timed megatron-profile timeout 120 python3 bench/gpu_seed_profile.py glm5-744b-a40b-4layer-1gpu \
  --trainer megatron --out "$out/profile"  # where megatron's further seed goes now
runs_report "$out"
