#!/bin/sh
# Action of step Flaky: fails until attempt `succeed_on`, like a service that needs a moment.
# drover sets DROVER_ATTEMPT to 1 on the first attempt, 2 on the first retry, and so on, so
# the outcome is the same every time the example runs.
# stdin:  {"kind": "Flaky", "value": {"succeed_on": 3}}
# stdout: []   (once it succeeds; before that it exits 1)
set -eu
task=$(cat)
succeed_on=$(printf '%s\n' "$task" | sed -n 's/.*"succeed_on"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
attempt=${DROVER_ATTEMPT:-1}
if [ "$attempt" -lt "${succeed_on:-3}" ]; then
  # The last line of stderr becomes the error message of this attempt.
  echo "flaky.sh: attempt $attempt: service unavailable, try again later" >&2
  exit 1
fi
echo "flaky.sh: attempt $attempt: succeeded" >&2
printf '[]\n'
