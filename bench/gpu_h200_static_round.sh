#!/usr/bin/env bash
# One fresh H200, most needed first: `NUM_GPUS=1 pytest -m nvidia tests/e2e` from nothing (the plugin prepares
# the checkpoints side by side; inductor's and fla's caches cold; every suite key calibrated from static
# seeds), junit kept; the rollout's sampler against `torch.multinomial` on CUDA; GLM-5 1-GPU with the
# megatron trainer, its experts grouped (`GroupedExperts`): seeds 0-9 against its key (a key they fail is
# calibrated anew from them, as `rlsmoke calibrate` writes it), ten seeds it never saw (100-109) and the
# one-sided temperature of 0.95 (200-204); the suite again, warm; the experts bench (grouped against
# SequentialMLP on this device); GLM-5 fsdp `--repeat 3`, its forward bits against 6e61c33's
# (`bench/same_bits.py`). The second call on the same machine: bench/gpu_h200_round_rest.sh. (As it ran at
# 6e61c33: `git show 6e61c33:bench/...`.)
#   [BUDGET_S=570] [CHECK=glm5-megatron] bench/gpu_h200_static_round.sh OUT_DIR
set -uo pipefail
out=${1:?OUT_DIR}
start=$(date +%s)
bash bench/gpu_h200_suite.sh "$out/fresh"  # sets up the wheels first: counted in its setup line
echo "fresh machine, the suite script with its evidence (env.txt, artifacts.tgz): $(( $(date +%s) - start )) s" | tee -a "$out/fresh/pytest.txt"
. bench/gpu_h200_setup.sh
mkdir -p "$out/runs"
steps_out=$out budget=${BUDGET_S:-570}
. bench/steps.sh
check=${CHECK:-glm5-megatron}
timed sampler-draws timeout 90 python3 -m pytest -q -p no:cacheprovider tests/unit/test_engine_rollout_batch.py \
  -k multinomial_draws
[ "$(left)" -gt 60 ] && check_key "$check" 0
[ "$(left)" -gt 100 ] && timed suite-warm timeout 150 bash bench/gpu_h200_suite.sh "$out/warm"
[ "$(left)" -gt 40 ] && timed experts-bench timeout 60 python3 bench/megatron_experts.py glm5-744b-a40b-4layer-1gpu \
  --device cuda
[ "$(left)" -gt 40 ] && timed glm5-fsdp timeout $(( $(left) < 95 ? $(left) - 5 : 90 )) rlsmoke run glm5-744b-a40b-4layer-1gpu \
  --platform nvidia --num-gpus 1 --repeat 3 --seed 0 --out "$out/runs/glm5-fsdp"
# its further seeds ran without the NaN fill: their forward-side bits against 6e61c33's, which had it on every seed
[ -f "$out/runs/glm5-fsdp/metrics.jsonl" ] && python3 bench/same_bits.py "$out/runs/glm5-fsdp" \
  fixtures/golden/gpu/h200-glm5-fsdp-static-capture-at-load-seeds-0-2.json > "$out/runs/glm5-fsdp-same-bits.txt" 2>&1
runs_report "$out"; tail -4 "$out/fresh/pytest.txt"; tail -4 "$out/warm/pytest.txt"
