#!/bin/sh
# Action of step Start: hands one task to each of the four retry demonstrations.
# stdin:  {"kind": "Start", "value": {}}                 (or {"slow": true})
# stdout: [{"kind": "Flaky", …}, {"kind": "Garbled", …}, {"kind": "Slow", …}, {"kind": "Fragile", …}]
set -eu
task=$(cat)
# Slow sleeps for this long. Its step times out after 3 s, so {"slow": true} makes it time out.
seconds=0
if printf '%s\n' "$task" | grep -q '"slow"[[:space:]]*:[[:space:]]*true'; then
  seconds=30
fi
printf '[{"kind": "Flaky", "value": {"succeed_on": 3}},'
printf ' {"kind": "Garbled", "value": {}},'
printf ' {"kind": "Slow", "value": {"seconds": %d}},' "$seconds"
printf ' {"kind": "Fragile", "value": {}}]\n'
