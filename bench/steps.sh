# Sourced by the GPU bench scripts: a budget in seconds and timed steps. The script sets `budget`,
# `start` (epoch seconds) and `steps_out` (where each step's output and timing.txt go) first.
left() { echo $(( budget - ($(date +%s) - start) )); }
timed() {  # timed NAME CMD...: its seconds and exit status into timing.txt, its output into NAME.txt
  local name=$1 t0; shift; t0=$(date +%s)
  "$@" > "$steps_out/$name.txt" 2>&1; local rc=$?
  echo "$name: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$steps_out/timing.txt"
}
runs_report() {  # runs_report OUT: each run's verdicts (OUT/verdicts.txt) and where its seconds went (seed-costs.md)
  python3 bench/seed_cost_table.py "$1"/runs/*/ > "$1/seed-costs.md" 2>&1
  for r in "$1"/runs/*/summary.json; do
    python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2], s['verdict'],
        s.get('per_repeat_verdict'), s.get('rollout_decode'), s['timing'].get('load_phases_s'))" "$r"
  done > "$1/verdicts.txt" 2>&1
  cat "$1/timing.txt" "$1/verdicts.txt" "$1/seed-costs.md"
}
# The one-GPU H200 keys a static round calibrates or checks, by short name: `rlsmoke run`'s case and flags.
declare -A KEY_RUNS=([flash]="glm5.3-flash-4layer-1gpu" [glm45-megatron]="glm4.5-355b-a32b-4layer --trainer megatron"
                     [glm45-fsdp]="glm4.5-355b-a32b-4layer" [glm5-megatron]="glm5-744b-a40b-4layer-1gpu --trainer megatron")
check_key() {  # check_key NAME ALWAYS: KEY_RUNS[NAME] on static seeds 0-9, the key anew from them when ALWAYS is 1 or
  # they fail it, then ten seeds it never saw (100-109) and the one-sided temperature of 0.95 on five (200-204)
  local k=$1 always=$2 one=(--platform nvidia --num-gpus 1 --rollout-decode static)
  timed "$k" timeout 170 rlsmoke run ${KEY_RUNS[$k]} "${one[@]}" --repeat 10 --seed 0 --out "$steps_out/runs/$k"
  if [ "$always" = 1 ] || ! grep -q '"verdict": "PASS"' "$steps_out/runs/$k/summary.json" 2>/dev/null; then
    timed "calibrate-$k" rlsmoke calibrate "$steps_out/runs/$k" --write fixtures/thresholds/builtin.json
  fi
  timed "$k-100" timeout 170 rlsmoke run ${KEY_RUNS[$k]} "${one[@]}" --repeat 10 --seed 100 --out "$steps_out/runs/$k-100"
  timed "$k-twin-t095" timeout 110 rlsmoke run ${KEY_RUNS[$k]} "${one[@]}" --repeat 5 --seed 200 \
    --inject temperature-mismatch --rollout-temperature 0.95 --out "$steps_out/runs/$k-twin-t095"
}
