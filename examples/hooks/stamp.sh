#!/bin/sh
# Pre hook of step Greet: adds a "received_at" field to the task value.
# stdin:  the task value,            e.g. {"name": "drover"}
# stdout: the value the action gets, e.g. {"name": "drover", "received_at": "2025-01-01T12:00:00Z"}
# The output is not checked against value_schema again, so a pre hook should only add fields.
# A non-zero exit skips the action; the post hook then gets a PreHookError result.
set -eu
value=$(cat)
case $value in
  *'}') ;;
  *) echo "stamp.sh: expected a JSON object on stdin" >&2; exit 1 ;;
esac
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# Drop the closing brace (and the blanks around it), then add the field and close again.
body=$(printf '%s\n' "$value" | sed '$ s/[[:space:]]*}[[:space:]]*$//')
case $body in
  *'{') separator='' ;;
  *) separator=', ' ;;
esac
printf '%s%s"received_at": "%s"}\n' "$body" "$separator" "$now"
