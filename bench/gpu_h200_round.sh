#!/usr/bin/env bash
# One command that measures the GPU fixed costs at the checked-out commit, on a fresh or warm H200:
# the one-GPU suite (bench/gpu_h200_suite.sh, which prepares the checkpoints untimed and unpacks a
# carried Triton cache), then Flash 1-GPU `--repeat 3`, one GLM-5 megatron seed, two GLM-4.5 fsdp
# seeds, the pre-engine profile (bench/process_profile.py) and the host's copy limits
# (bench/gpu_limits.py), within BUDGET_S seconds. Everything is packed into one archive,
# OUT_DIR/round.tgz, easy to carry off a remote host whole: timing.txt (each step's seconds), each
# step's output, the suite's folder and the runs' records (weights excluded).
#   bench/gpu_h200_round.sh OUT_DIR [BUDGET_S] [PYTEST_ARGS...]
set -uo pipefail
dest=${1:?OUT_DIR}; budget=${2:-570}; shift; shift || true
start=$(date +%s)
work=/root/round-out; runs=$work/runs; mkdir -p "$dest" "$runs"
trap 'tar czf "$dest/round.tgz" -C "$work" --exclude "*.safetensors" . 2>/dev/null' EXIT
steps_out=$work; . bench/steps.sh
gpu_idle() {  # a step cut by its timeout may leave a run that still holds the GPU for a few seconds
  for _ in $(seq 60); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && return; sleep 1; done
}
timed suite timeout $(( $(left) - 200 )) bash bench/gpu_h200_suite.sh "$work/suite" "$@"
gpu_idle
. bench/gpu_h200_setup.sh
one=(--platform nvidia --num-gpus 1)
timed flash-repeat3 timeout $(( $(left) - 130 )) rlsmoke run glm5.3-flash-4layer-1gpu "${one[@]}" --repeat 3 --seed 20 --out $runs/flash-repeat3
gpu_idle
timed glm5-megatron timeout $(( $(left) - 90 )) rlsmoke run glm5-744b-a40b-4layer-1gpu "${one[@]}" --seed 4 --trainer megatron --out $runs/glm5-megatron
timed glm45-fsdp timeout $(( $(left) - 30 )) rlsmoke run glm4.5-355b-a32b-4layer "${one[@]}" --repeat 2 --seed 4 --out $runs/glm45-fsdp
timed process-profile timeout $(( $(left) - 25 )) python3 bench/process_profile.py
timed limits timeout $(( $(left) - 3 )) python3 bench/gpu_limits.py --gib 4
