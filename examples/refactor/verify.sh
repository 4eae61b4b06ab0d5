#!/bin/sh
# Action of step Verify: runs the check in the repository after a change was applied.
# stdin:  {"kind": "Verify", "value": {"root": "/abs/repo", "file": "src/lib.rs", "check": "cargo check",
#                                      "title": "…", "round": 1}}
# stdout: [] when the check passes; otherwise nothing, and exit code 1
#
# The check runs as `sh -c CHECK` in root, with FILE set to the changed file (relative to
# root), so a check may look at that file only (e.g. `sh -n "$FILE"`) or ignore it (e.g.
# `cargo check`). Its output goes to stderr, which drover keeps with the task
# (`drover inspect RUN_ID --task TASK_ID`); the last line of stderr becomes the error of a
# failed attempt, and the post hook (after_verify.sh) turns it into a Repair task.
set -eu
command -v jq >/dev/null 2>&1 || { echo "verify.sh: jq is required (https://jqlang.org)" >&2; exit 1; }
value=$(jq -c '.value')
field() { printf '%s\n' "$value" | jq -r ".$1"; }
root=$(field root)
file=$(field file)
check=$(field check)
title=$(field title)
round=$(printf '%s\n' "$value" | jq -r '.round // 1')
cd "$root" || { echo "verify.sh: cannot enter root $root" >&2; exit 1; }
echo "verify.sh: round $round: running \`$check\` in $root after \"$title\" in $file" >&2
if FILE=$file sh -c "$check" </dev/null 1>&2; then
  echo "verify.sh: the check passes after \"$title\"" >&2
  printf '[]\n'
else
  status=$?
  echo "verify.sh: \`$check\` failed (exit code $status) after \"$title\" in $file" >&2
  exit 1
fi
