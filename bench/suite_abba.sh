#!/usr/bin/env bash
# The README's test command on two trees back to back, old, new, new, old (ABBA), on one machine: the shared
# machine's speed drifts between runs, a ratio within one run does not.
#   bench/suite_abba.sh OLD_TREE NEW_TREE OUT.txt   (checkouts; each run imports its own src through PYTHONPATH)
set -uo pipefail
old=${1:?OLD_TREE} new=${2:?NEW_TREE} out=${3:?OUT.txt}
: > "$out"
for name in old1:$old new1:$new new2:$new old2:$old; do
  tree=${name#*:} load=$(cut -d' ' -f1 /proc/loadavg) t0=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH=$tree/src pytest -n auto --dist loadscope -q -p no:cacheprovider > "$out.${name%%:*}.log" 2>&1)
  echo "${name%%:*} $(echo "$(date +%s.%N) - $t0" | bc) s, load $load at its start: $(tail -1 "$out.${name%%:*}.log")" >> "$out"
done
cat "$out"
