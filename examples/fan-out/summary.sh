#!/bin/sh
# `finally` hook of step Split. It runs once, after the Split task and every task descending
# from it (all Work tasks, and their Review tasks) are settled, whether they completed or failed.
# stdin:  the Split task's original value, e.g. {"count": 3}
# stdout: a JSON array of tasks to spawn next (none here)
# stderr: a summary, recorded with the run
set -eu
value=$(cat)
count=$(printf '%s\n' "$value" | sed -n 's/.*"count"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
echo "summary.sh: run ${DROVER_RUN_ID:-?}: all ${count:-3} Work tasks and their descendants have settled" >&2
printf '[]\n'
