#!/bin/sh
# Action of step Fragile: always fails. Its post hook (give_up.sh) turns the final failure
# into a Recover task.
# stdin:  {"kind": "Fragile", "value": {}}
# stdout: nothing; exits 1
set -eu
cat >/dev/null
echo "fragile.sh: attempt ${DROVER_ATTEMPT:-1}: the disk is full" >&2
exit 1
