#!/usr/bin/env bash
# fla's kernel configs for this GPU, and what they save on a cold Triton cache. On one host, both from
# an empty Triton cache:
#   1. GLM-5.3-Flash 1-GPU with fla's autotune (FLA_CACHE_MODE=disabled), its choices recorded
#      (RLSMOKE_FLA_RECORD) into OUT_DIR/fla_configs/<GPU>/;
#   2. the same run with those configs installed where rlsmoke ships them (fixtures/fla_configs/<GPU>/).
# Copy OUT_DIR/fla_configs/<GPU>/ to fixtures/fla_configs/ to ship them.
#   bench/gpu_fla_configs.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
. bench/gpu_h200_setup.sh
mkdir -p "$out"
case=glm5.3-flash-4layer-1gpu
one=(--platform nvidia --num-gpus 1 --seed 3)
t0=$(date +%s); rlsmoke prepare "$case" > "$out/prepare.txt" 2>&1; echo "prepare: $(( $(date +%s) - t0 )) s" | tee "$out/timing.txt"
gpu=$(python3 -c 'import torch; from rlsmoke.engine.fla_configs import gpu_folder; print(gpu_folder(torch.cuda.get_device_name(0)))')
t0=$(date +%s)
TRITON_CACHE_DIR=/tmp/triton-autotune FLA_CACHE_MODE=disabled RLSMOKE_FLA_RECORD="$out/fla_configs" \
  RLSMOKE_FLA_RECORD_COMMAND="bench/gpu_fla_configs.sh (rlsmoke run $case ${one[*]})" \
  rlsmoke run "$case" "${one[@]}" --out /tmp/fla-autotune > "$out/autotune.txt" 2>&1; rc=$?
echo "autotune run: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
(cd "$out" && tar czf fla_configs.tgz fla_configs)  # what comes back from a remote host, whatever follows
mkdir -p fixtures/fla_configs && rm -rf "fixtures/fla_configs/$gpu" && cp -r "$out/fla_configs/$gpu" fixtures/fla_configs/
t0=$(date +%s)
TRITON_CACHE_DIR=/tmp/triton-shipped timeout "${SHIPPED_LIMIT_S:-400}" \
  python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' run "$case" "${one[@]}" --out /tmp/fla-shipped > "$out/shipped.txt" 2>&1; rc=$?
echo "shipped-configs run: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$out/timing.txt"
for r in autotune shipped; do
  python3 -c "import json,sys; s=json.load(open('/tmp/fla-$r/summary.json')); print('$r', s.get('fla_configs'), s.get('timing'))" >> "$out/timing.txt" 2>&1
  cp /tmp/fla-$r/summary.json "$out/summary-$r.json" 2>/dev/null
done
rm -rf "$out/fla_configs"
cat "$out/timing.txt"
