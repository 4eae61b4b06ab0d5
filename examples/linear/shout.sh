#!/bin/sh
# Action of step Shout: upper-cases the text and hands it to Print.
# stdin:  {"kind": "Shout", "value": {"text": "hello, drover"}}
# stdout: [{"kind": "Print", "value": {"text": "HELLO, DROVER!"}}]
set -eu
task=$(cat)
text=$(printf '%s\n' "$task" | sed -n 's/.*"text"[[:space:]]*:[[:space:]]*"\([^"\\]*\)".*/\1/p' | head -n 1)
loud=$(printf '%s' "$text" | tr '[:lower:]' '[:upper:]')
printf '[{"kind": "Print", "value": {"text": "%s!"}}]\n' "$loud"
