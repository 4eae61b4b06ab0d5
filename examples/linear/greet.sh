#!/bin/sh
# Action of step Greet.
# stdin:  {"kind": "Greet", "value": {"name": "drover"}}
# stdout: [{"kind": "Shout", "value": {"text": "hello, drover"}}]
set -eu
task=$(cat)
# The value schema limits "name" to a plain word, so sed can pick it out safely.
name=$(printf '%s\n' "$task" | sed -n 's/.*"name"[[:space:]]*:[[:space:]]*"\([^"\\]*\)".*/\1/p' | head -n 1)
[ -n "$name" ] || name=world
printf '[{"kind": "Shout", "value": {"text": "hello, %s"}}]\n' "$name"
