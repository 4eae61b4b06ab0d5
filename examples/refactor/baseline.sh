#!/bin/sh
# Pre hook of step ListFiles: runs the check once before anything is changed.
# stdin:  the ListFiles value, e.g. {"root": "/home/me/src/app", "glob": "*.rs", "check": "cargo check"}
# stdout: the same value, unchanged (a pre hook prints the value the action gets)
#
# If the repository does not pass its own check to begin with, every Verify would fail and
# send agents to "repair" breakage they did not cause. So a failing baseline makes this hook
# exit 1: the action is skipped, the run records a PreHookError for ListFiles and ends (the
# finally hook still writes the report). The check runs with FILE empty (see verify.sh).
set -eu
command -v jq >/dev/null 2>&1 || { echo "baseline.sh: jq is required (https://jqlang.org)" >&2; exit 1; }
value=$(cat)
root=$(printf '%s\n' "$value" | jq -r '.root')
check=$(printf '%s\n' "$value" | jq -r '.check')
cd "$root" || { echo "baseline.sh: cannot enter root $root" >&2; exit 1; }
echo "baseline.sh: running \`$check\` in $root before any change" >&2
# The check's own output goes to stderr, which drover keeps with the task; stdout is ours.
if FILE='' sh -c "$check" </dev/null 1>&2; then
  echo "baseline.sh: the check passes; starting" >&2
  printf '%s\n' "$value"
else
  status=$?
  echo "baseline.sh: \`$check\` already fails (exit code $status) before any change: fix that first, or pick another check" >&2
  exit 1
fi
