#!/usr/bin/env bash
# Miles' trainer for one step on a fresh H200 host (Python 3.12, torch 2.11, no package index): set up
# Miles' environment from .miles-carry/, check what only the GPU can settle, then run the train-only
# step and its twin. NOT RUN YET: written from docs/miles.md's facts; the first GPU run decides.
#   bench/gpu_miles_train_only.sh OUT_DIR [CASE] [BUDGET_S]
# .miles-carry/ (git-ignored; made where the index is, as docs/miles.md lists) holds:
#   wheels/*.whl        every package of docs/miles.md's table, installed --no-deps (torch stays the host's)
#   build/*.whl         transformer_engine_torch 2.17.0, built against torch 2.11 (no binary wheel exists)
#   miles.tar           `git archive 31f1ca961` of radixark/miles
#   megatron.tar        `git archive 2e64d788b` of radixark/Megatron-LM (branch miles-main)
#   overlay/            the import-only stand-ins docs/miles.md names (sgl_kernel, mooncake/engine.py, ...)
set -uo pipefail
out=${1:?OUT_DIR}; case_name=${2:-glm4.5-355b-a32b-4layer}; budget=${3:-3000}
carry=$PWD/.miles-carry
steps_out=$out; start=$(date +%s)
. "$(dirname "$0")/steps.sh"
mkdir -p "$out"
for need in "$carry/wheels" "$carry/build" "$carry/miles.tar" "$carry/megatron.tar" "$carry/overlay"; do
  [ -e "$need" ] || { echo "error: [bench.carry] $need is missing. Fix: fill .miles-carry/ as docs/miles.md says"; exit 2; }
done
python3 -c 'import sys, torch; assert sys.version_info[:2] == (3, 12), sys.version; assert torch.__version__.startswith("2.11"), torch.__version__' \
  || { echo "error: [bench.host] needs Python 3.12 and torch 2.11. Fix: run on the H200 image"; exit 2; }

# Miles' environment beside the host's packages: nothing of the host is upgraded (--no-deps, a target dir).
site=/tmp/miles-site
timed install python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
  "$carry"/wheels/*.whl "$carry"/build/*.whl
mkdir -p /root/miles /root/Megatron-LM
tar -xf "$carry/miles.tar" -C /root/miles && tar -xf "$carry/megatron.tar" -C /root/Megatron-LM
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > /dev/null 2>&1 || true
# the overlay first: its stand-ins and names win over the installed packages they complete
export PYTHONPATH=$carry/overlay:$PWD/src:$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
export RLSMOKE_CACHE=${RLSMOKE_CACHE:-/root/rlsmoke-cache}
rlsmoke() { python3 -c 'import sys; from rlsmoke.cli import main; sys.exit(main())' "$@"; }

# What only the GPU host can settle, each in under a minute, before the long steps.
timed probe-te timeout 120 python3 -c 'import transformer_engine.pytorch as te, torch; l = te.Linear(64, 64).cuda(); print(l(torch.randn(8, 64, device="cuda")).shape)'
timed probe-tilelang timeout 120 python3 -c 'import tilelang; print(tilelang.__version__)'
timed probe-ray timeout 120 python3 -c 'import ray; ray.init(num_gpus=1, include_dashboard=False); print(ray.cluster_resources()); ray.shutdown()'
timed probe-miles timeout 300 env PYTHONPATH=/root/miles:/root/Megatron-LM:$PYTHONPATH python3 -c 'import train, miles.backends.megatron_utils.actor'
cat "$out/timing.txt"

flags=(--launcher miles --train-only --miles-root /root/miles --megatron-root /root/Megatron-LM --platform nvidia
       --num-gpus 1 --model-dir /root/models)
rlsmoke plan "$case_name" --platform nvidia --num-gpus 1 --launcher miles --train-only > "$out/plan.sh"
[ "$(left)" -gt 600 ] && timed clean timeout "$(left)" rlsmoke run "$case_name" "${flags[@]}" --out "$out/clean"
# the twin: the file's log-probs of the raw logits while Miles divides by 0.8; its gate must fail (exit 1)
[ "$(left)" -gt 300 ] && timed twin-temperature timeout "$(left)" rlsmoke run "$case_name" "${flags[@]}" \
  --rollout-temperature 0.8 --inject temperature-mismatch --out "$out/twin-temperature"
tail -12 "$out/clean.txt" "$out/twin-temperature.txt" 2>/dev/null
cat "$out/timing.txt"
