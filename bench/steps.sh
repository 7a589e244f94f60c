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
                     [glm45-fsdp]="glm4.5-355b-a32b-4layer")
