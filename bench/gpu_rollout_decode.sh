#!/usr/bin/env bash
# The rollout's decode paths on one H200, GLM-5 4-layer 1-GPU: tokens/s of `generate` and of the static
# decode (--rollout-decode static), the static one's compile cold (empty inductor and Triton caches) and
# warm (the same caches, a new process), the two in float32, then both through `rlsmoke run --repeat 3`
# with the gates.
#   bench/gpu_rollout_decode.sh OUT_DIR
# Figures: OUT_DIR/cold.txt, warm.txt (bench/rollout_decode.py), run-*.txt and summary-*.json; a digest
# at the end. The compile caches live in OUT_DIR/cache, so a rerun on this host is warm.
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out"
case=${CASE:-glm5-744b-a40b-4layer-1gpu}
limit=${LIMIT_S:-540}
t0=$(date +%s); rlsmoke prepare "$case" > "$out/prepare.txt" 2>&1; echo "prepare: $(( $(date +%s) - t0 )) s" | tee "$out/timing.txt"
rm -rf "$out/cache"
export TORCHINDUCTOR_CACHE_DIR=$out/cache/inductor TRITON_CACHE_DIR=$out/cache/triton
for pass in cold warm float32; do
  t0=$(date +%s)
  dtype=(); [ $pass = float32 ] && dtype=(--dtype float32)  # the two paths' sampling, without bf16's rounding
  TORCH_LOGS=${TORCH_LOGS-graph_breaks,recompiles} timeout "$limit" python3 bench/rollout_decode.py "$case" \
    --seeds "${SEEDS:-3}" "${dtype[@]}" > "$out/$pass.txt" 2> "$out/$pass.log"; rc=$?
  echo "$pass pass: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
done
for decode in generate static; do
  t0=$(date +%s)
  timeout "$limit" python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' run "$case" \
    --platform nvidia --num-gpus 1 --seed 0 --repeat 3 --rollout-decode $decode --out "/tmp/decode-$decode" \
    --overwrite > "$out/run-$decode.txt" 2>&1; rc=$?
  echo "run --rollout-decode $decode: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
  cp "/tmp/decode-$decode/summary.json" "$out/summary-$decode.json" 2>/dev/null
  python3 -c "import json; s=json.load(open('$out/summary-$decode.json')); t=s['timing']
print('$decode', s.get('rollout_decode'), 'per seed', t['per_seed_s'], 'rollout', [p.get('rollout') for p in t['seed_phases_s']])" \
    >> "$out/timing.txt" 2>&1
done
for pass in cold warm float32; do echo "== $pass"; cat "$out/$pass.txt"; done
grep -h "verdict" "$out"/run-*.txt
cat "$out/timing.txt"
