#!/usr/bin/env bash
# Run tests/conformance in each conformance venv (one real parser each), then the cross-venv check_plan
# from the main venv. Fails if any test failed, was skipped, or none ran: in CI a parser that cannot be
# imported is a failure, not a skip.
#
#   bash .ci/conformance-envs.sh && bash .ci/conformance.sh
#
# The venvs: $RLSMOKE_CONFORMANCE_VENVS/cvenv-{miles,sglang,mcore} (default ~/.cache/rlsmoke/conformance). The main venv's
# python: $RLSMOKE_MAIN_PYTHON, else `python` on PATH (.ci/run puts its venv first).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="${RLSMOKE_CONFORMANCE_VENVS:-$HOME/.cache/rlsmoke/conformance}"
MAIN_PYTHON="${RLSMOKE_MAIN_PYTHON:-python}"
REPORTS="$(mktemp -d)"
trap 'rm -rf "$REPORTS"' EXIT
cd "$REPO"
# This checkout's rlsmoke, whatever the venvs' editable installs point at (CI clones elsewhere).
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"

run() {  # parser python
  local parser="$1" python="$2" start=$SECONDS rc=0
  echo "-- conformance[$parser] ($python)"
  RLSMOKE_CONFORMANCE_PARSER="$parser" "$python" -m pytest tests/conformance -q -rs -W ignore \
    -p no:cacheprovider -p no:rlsmoke --junitxml="$REPORTS/$parser.xml" || rc=$?
  echo "conformance[$parser]: $((SECONDS - start)) s, pytest exit $rc"
  return 0
}

run miles "$VENVS/cvenv-miles/bin/python"
run sglang "$VENVS/cvenv-sglang/bin/python"
run mcore "$VENVS/cvenv-mcore/bin/python"
run runner "$MAIN_PYTHON"

# One verdict over the four reports: every run must have tests, and no failure, error or skip.
python3 - "$REPORTS" <<'EOF'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

bad = []
for parser in ("miles", "sglang", "mcore", "runner"):
    path = Path(sys.argv[1]) / f"{parser}.xml"
    if not path.exists():
        bad.append(f"{parser}: no report (pytest did not run)")
        continue
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    print(f"conformance[{parser}]: {n['tests']} tests, {n['failures']} failed, {n['errors']} errors, "
          f"{n['skipped']} skipped")
    for case in suite.iter("testcase"):
        for tag in ("skipped", "failure", "error"):
            el = case.find(tag)
            if el is not None:
                reason = (el.get("message") or "").splitlines()[0][:300] if el.get("message") else ""
                bad.append(f"{parser}: {tag}: {case.get('name')}: {reason}")
    if n["tests"] == 0:
        bad.append(f"{parser}: no test ran")
if bad:
    print("conformance FAILED (a skip is a failure here: every real parser must run):", *bad, sep="\n  ")
    sys.exit(1)
print("conformance: every real parser ran; rlsmoke agrees with each, case for case")
EOF
