#!/usr/bin/env bash
# The static round's second call, on the same warm H200 (its caches and checkpoints kept; the thresholds as
# the first call's `calibrate` wrote them here): GLM-5.3-Flash's new key against ten seeds it never saw
# (100-109) and the one-sided temperature of 0.95 on five (200-204); a megatron seed under torch.profiler;
# then, while the budget lasts, GLM-4.5 4-layer static with each trainer (its fsdp key calibrated) and both
# tiny widths.
#   [BUDGET_S=570] bench/gpu_h200_round_rest.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570} start=$(date +%s)
. bench/steps.sh
flash=glm5.3-flash-4layer-1gpu glm45=glm4.5-355b-a32b-4layer glm5=glm5-744b-a40b-4layer-1gpu
one=(--platform nvidia --num-gpus 1)
ten=("${one[@]}" --repeat 10 --seed 0 --rollout-decode static)  # auto keeps generate until calibrated
timed flash-100 timeout 150 rlsmoke run $flash "${one[@]}" --repeat 10 --seed 100 --out "$out/runs/flash-100"
timed flash-twin-t095 timeout 100 rlsmoke run $flash "${one[@]}" --repeat 5 --seed 200 \
  --inject temperature-mismatch --rollout-temperature 0.95 --out "$out/runs/flash-twin-t095"
[ "$(left)" -gt 100 ] && timed megatron-profile timeout 90 python3 bench/gpu_seed_profile.py $glm5 --trainer megatron \
  --out "$out/profile"  # where megatron's further seed goes over fsdp's
[ "$(left)" -gt 120 ] && timed glm45-fsdp timeout $(( $(left) - 15 )) rlsmoke run $glm45 "${ten[@]}" \
  --out "$out/runs/glm45-fsdp" && timed calibrate rlsmoke calibrate "$out/runs/glm45-fsdp" \
  --write fixtures/thresholds/builtin.json
[ "$(left)" -gt 200 ] && timed glm45-megatron timeout $(( $(left) - 5 )) rlsmoke run $glm45 "${ten[@]}" \
  --trainer megatron --out "$out/runs/glm45-megatron"
for c in glm5-744b-a40b-4layer $glm45; do
  [ "$(left)" -gt 40 ] && timed "${c%%-*}-tiny" timeout $(( $(left) - 5 )) rlsmoke run $c "${ten[@]}" --tiny \
    --out "$out/runs/${c%%-*}-tiny"
done
runs_report "$out"
