#!/usr/bin/env bash
# GLM-5.3-Flash on one H200, one command: the host's limits, the Flash 1-GPU checkpoint and fla's Triton
# compile, 10 seeds to calibrate its key, the key, then `--repeat 3` on seeds it was not calibrated on,
# and a reference-KDA seed for the numerics. The other suite cases' checkpoints build alongside.
# Everything it writes is packed into OUT_DIR/flash.tgz (and the Triton cache into OUT_DIR/triton.tgz).
#   bench/gpu_h200_flash.sh OUT_DIR [BUDGET_S]
set -uo pipefail
dest=${1:?OUT_DIR}; budget=${2:-560}
. bench/gpu_h200_setup.sh
case_name=glm5.3-flash-4layer-1gpu
runs=/root/runs; out=/root/flash-out; mkdir -p "$dest" "$runs" "$out"
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
pack() {
  cp -r "$runs"/. "$out/runs/" 2>/dev/null
  tar czf "$dest/flash.tgz" -C "$out" --exclude '*.safetensors' . 2>/dev/null
  tar czf "$dest/triton.tgz" -C "$RLSMOKE_CACHE" triton 2>/dev/null
}
trap pack EXIT
mkdir -p "$out/runs"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, transformers, sys; print(torch.__version__, transformers.__version__, sys.version)'
  python3 -c 'import fla, triton; print("fla", fla.__version__, "triton", triton.__version__)'; date; } > "$out/env.txt" 2>&1
python3 bench/gpu_limits.py --gib 4 > "$out/limits.txt" 2>&1
python3 -m pytest -q tests/unit/test_engine_offload_staged.py > "$out/staged.txt" 2>&1  # CUDA parameters too
( for c in glm5-744b-a40b-4layer-1gpu glm4.5-355b-a32b-4layer; do
    t0=$(date +%s); rlsmoke prepare "$c" > /dev/null 2>&1; rc=$?; echo "prepare $c: $(( $(date +%s) - t0 )) s, exit $rc"
  done ) > "$out/prepare-others.txt" 2>&1 &
others=$!
t0=$(date +%s); rlsmoke prepare "$case_name" > "$out/prepare.txt" 2>&1; rc=$?
echo "prepare $case_name: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
t0=$(date +%s)
timeout $(( $(left) - 150 )) rlsmoke run "$case_name" --platform nvidia --num-gpus 1 --seed 0 --repeat 10 \
  --out "$runs/cal" > "$out/cal.txt" 2>&1; rc=$?
echo "calibration seeds 0-9: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
rlsmoke calibrate "$runs/cal" --write fixtures/thresholds/builtin.json > "$out/calibrate.txt" 2>&1
cp fixtures/thresholds/builtin.json "$out/builtin.json"; cp fixtures/thresholds/builtin.json "$runs/builtin.json"
wait $others
t0=$(date +%s)
timeout $(( $(left) - 20 )) rlsmoke run "$case_name" --platform nvidia --num-gpus 1 --seed 10 --repeat 3 \
  --out "$runs/r3" > "$out/r3.txt" 2>&1; rc=$?
echo "repeat 3 (seeds 10-12): $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
if [ "$(left)" -gt 100 ]; then
  t0=$(date +%s)
  RLSMOKE_KDA=reference timeout $(( $(left) - 20 )) rlsmoke run "$case_name" --platform nvidia --num-gpus 1 \
    --seed 10 --out "$runs/ref" > "$out/ref.txt" 2>&1; rc=$?
  echo "reference KDA seed 10: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
fi
