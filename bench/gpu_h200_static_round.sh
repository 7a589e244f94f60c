#!/usr/bin/env bash
# The static decode on one fresh H200, most needed first: `NUM_GPUS=1 pytest -m nvidia tests/e2e` from nothing
# (the plugin prepares the checkpoints side by side; inductor's and fla's caches cold; every suite key now
# calibrated from static seeds), junit kept; the keys still `generate`'s calibrated anew from ten static seeds
# each (`CALIBRATE`, default GLM-4.5 4-layer with the megatron trainer), written into this checkout's
# thresholds as `rlsmoke calibrate` writes them; GLM-5 1-GPU `--repeat 3` with each trainer (the first seed,
# the capture at the load); the suite again, warm. The second call on the same machine:
# bench/gpu_h200_round_rest.sh. (At 6e61c33 the calibrated key was GLM-5.3-Flash's: `CALIBRATE=flash`.)
#   [BUDGET_S=570] [CALIBRATE="glm45-megatron flash ..."] bench/gpu_h200_static_round.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
start=$(date +%s)
bash bench/gpu_h200_suite.sh "$out/fresh"  # sets up the wheels first: counted in its setup line
echo "fresh machine, checkpoints and suite: $(( $(date +%s) - start )) s in all" | tee -a "$out/fresh/pytest.txt"
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570}
. bench/steps.sh
ten=(--platform nvidia --num-gpus 1 --repeat 10 --seed 0 --rollout-decode static)  # auto keeps generate until calibrated
glm5=glm5-744b-a40b-4layer-1gpu
for k in ${CALIBRATE:-glm45-megatron}; do  # ten static seeds, then the key from them
  [ "$(left)" -gt 60 ] && timed "$k" timeout $(( $(left) < 175 ? $(left) - 5 : 170 )) rlsmoke run ${KEY_RUNS[$k]} "${ten[@]}" \
    --out "$out/runs/$k" && timed "calibrate-$k" rlsmoke calibrate "$out/runs/$k" --write fixtures/thresholds/builtin.json
done
for trainer in fsdp megatron; do  # GLM-5 1-GPU's first seeds, auto's decode (static: its keys say so)
  [ "$(left)" -gt 40 ] && timed "glm5-$trainer" timeout $(( $(left) < 95 ? $(left) - 5 : 90 )) rlsmoke run $glm5 --platform nvidia --num-gpus 1 --trainer "$trainer" --repeat 3 --seed 0 \
    --out "$out/runs/glm5-$trainer"
done
[ "$(left)" -gt 100 ] && timed suite-warm timeout $(( $(left) - 5 )) bash bench/gpu_h200_suite.sh "$out/warm"
runs_report "$out"; tail -4 "$out/fresh/pytest.txt"; tail -4 "$out/warm/pytest.txt"
