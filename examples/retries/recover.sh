#!/bin/sh
# Action of step Recover: would clean up, alert someone or queue the work for later. Here it
# only shows what it was given.
# stdin:  {"kind": "Recover", "value": {"task": "01J…", "attempts": 2, "error": "…"}}
# stdout: []
set -eu
echo "recover.sh: recovering after a task gave up:" >&2
cat >&2
echo >&2
printf '[]\n'
