#!/bin/sh
# Post hook of step Greet. It runs after every attempt.
# stdin: the result of the attempt, one of
#   {"kind": "Success",      "input": {…}, "output": [ … ], "next": [ … ]}
#   {"kind": "Timeout",      "input": {…}}
#   {"kind": "Error",        "input": {…}, "error": "…"}
#   {"kind": "PreHookError", "input": {…}, "error": "…"}
# stdout: the result to use instead (same shape; its "next" is checked like an action's answer).
#
# Success and Timeout pass through unchanged. An Error or PreHookError stays a failure (so the
# retry policy still applies), but gets a "next" with a Recover task: when the last attempt
# fails, the task is marked failed and that recovery task is spawned.
set -eu
result=$(cat)
if printf '%s\n' "$result" | grep -Eq '"kind"[[:space:]]*:[[:space:]]*"(Error|PreHookError)"'; then
  body=$(printf '%s\n' "$result" | sed '$ s/[[:space:]]*}[[:space:]]*$//')
  printf '%s, "next": [{"kind": "Recover", "value": {"failed_task": "%s"}}]}\n' \
    "$body" "${DROVER_TASK_ID:-unknown}"
else
  printf '%s\n' "$result"
fi
