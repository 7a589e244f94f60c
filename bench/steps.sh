# Sourced by the GPU bench scripts: a budget in seconds and timed steps. The script sets `budget`,
# `start` (epoch seconds) and `steps_out` (where each step's output and timing.txt go) first.
left() { echo $(( budget - ($(date +%s) - start) )); }
timed() {  # timed NAME CMD...: its seconds and exit status into timing.txt, its output into NAME.txt
  local name=$1 t0; shift; t0=$(date +%s)
  "$@" > "$steps_out/$name.txt" 2>&1; local rc=$?
  echo "$name: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$steps_out/timing.txt"
}
