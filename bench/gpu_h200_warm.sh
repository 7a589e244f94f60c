#!/usr/bin/env bash
# A fresh H200 made ready for the one-GPU suite, and the fixed costs measured on it, in one command:
# the three suite checkpoints prepared, fla's Triton kernels compiled by a first Flash run (the cache
# is packed into OUT_DIR as triton.tgz.* for a later machine), then one run per load measurement:
# GLM-5 4-layer (fsdp, megatron) and GLM-4.5 4-layer (fsdp), each a single seed with a warm checkpoint
# cache. Everything but the weights is packed into OUT_DIR/warm.tgz.
#   bench/gpu_h200_warm.sh OUT_DIR [BUDGET_S]
set -uo pipefail
dest=${1:?OUT_DIR}; budget=${2:-560}
. bench/gpu_h200_setup.sh
runs=/root/runs; out=/root/warm-out; mkdir -p "$dest" "$runs" "$out"
start=$(date +%s)
pack() {
  for d in "$runs"/*/; do [ -d "$d" ] && mkdir -p "$out/runs/$(basename "$d")" && cp "$d"/*.json* "$d"/run.log "$out/runs/$(basename "$d")/" 2>/dev/null; done
  tar czf "$dest/warm.tgz" -C "$out" . 2>/dev/null
  [ -d "$RLSMOKE_CACHE/triton" ] && tar czf - -C "$RLSMOKE_CACHE" triton | split -b 15M - "$dest/triton.tgz."
  du -sh "$RLSMOKE_CACHE/triton" "$dest"/* 2>/dev/null
}
trap pack EXIT
steps_out=$out; . bench/steps.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, transformers, sys; print(torch.__version__, transformers.__version__, sys.version)'
  python3 -c 'import fla, triton, megatron.core as m; print("fla", fla.__version__, "triton", triton.__version__, "megatron-core", m.__version__)'
  nproc; free -g; date; } > "$out/env.txt" 2>&1
( timed prepare-glm5 rlsmoke prepare glm5-744b-a40b-4layer-1gpu
  timed prepare-glm45 rlsmoke prepare glm4.5-355b-a32b-4layer ) &
others=$!
flash=glm5.3-flash-4layer-1gpu
timed prepare-flash rlsmoke prepare $flash
timed flash-first-run timeout $(( $(left) - 200 )) rlsmoke run $flash --platform nvidia --num-gpus 1 --seed 10 --out $runs/flash-first
timed flash-warm-run timeout $(( $(left) - 150 )) rlsmoke run $flash --platform nvidia --num-gpus 1 --seed 11 --out $runs/flash-warm
wait $others
one=(--platform nvidia --num-gpus 1 --seed 4)
timed glm5-fsdp timeout $(( $(left) - 100 )) rlsmoke run glm5-744b-a40b-4layer-1gpu "${one[@]}" --out $runs/glm5-fsdp
timed glm5-megatron timeout $(( $(left) - 60 )) rlsmoke run glm5-744b-a40b-4layer-1gpu "${one[@]}" --trainer megatron --out $runs/glm5-megatron
timed glm45-fsdp timeout $(( $(left) - 10 )) rlsmoke run glm4.5-355b-a32b-4layer "${one[@]}" --out $runs/glm45-fsdp
