#!/bin/sh
# Action of step Slow: sleeps `seconds`, then answers []. The step's timeout is 3 s, so
# {"seconds": 30} times out: drover kills this script's whole process group (SIGTERM, then
# SIGKILL after 5 s) and, because the step sets "retry_on_timeout": false, fails the task
# at once instead of retrying it.
# stdin:  {"kind": "Slow", "value": {"seconds": 0}}
# stdout: []
set -eu
task=$(cat)
seconds=$(printf '%s\n' "$task" | sed -n 's/.*"seconds"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
echo "slow.sh: attempt ${DROVER_ATTEMPT:-1}: working for ${seconds:-0} s" >&2
sleep "${seconds:-0}"
printf '[]\n'
