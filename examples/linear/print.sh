#!/bin/sh
# Action of step Print, the terminal step: shows the text and emits no further tasks.
# stdin:  {"kind": "Print", "value": {"text": "HELLO, DROVER!"}}
# stdout: []
set -eu
task=$(cat)
text=$(printf '%s\n' "$task" | sed -n 's/.*"text"[[:space:]]*:[[:space:]]*"\([^"\\]*\)".*/\1/p' | head -n 1)
# stderr is kept with the task (see `drover inspect RUN --task TASK`).
printf '%s\n' "$text" >&2
printf '[]\n'
