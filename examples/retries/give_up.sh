#!/bin/sh
# Post hook of step Fragile. It runs after EVERY attempt, with the attempt's result on stdin:
#   {"kind": "Success",      "input": {…}, "output": [ … ], "next": [ … ]}
#   {"kind": "Timeout",      "input": {…}}
#   {"kind": "Error",        "input": {…}, "error": "…"}
#   {"kind": "PreHookError", "input": {…}, "error": "…"}
# and prints the result drover should use instead.
#
# Before the last attempt it passes the result through unchanged, so a failure is retried.
# On the last attempt (MAX_ATTEMPTS, set in workflow.jsonc: 1 + the step's max_retries) it
# replaces a failure with a Success whose `next` is a Recover task: the Fragile task counts as
# completed and the recovery task runs, so the run can still end with exit code 0.
#
# (To keep the task marked as failed instead, print the Error unchanged with a "next" array
# added, as examples/hooks/recover.sh does: a failed task still spawns the `next` that a post
# hook put on its result, and the run then ends with exit code 1.)
set -eu
result=$(cat)
attempt=${DROVER_ATTEMPT:-1}
case $result in
  '{"kind":"Error"'* | '{"kind":"PreHookError"'* | '{"kind":"Timeout"'*) ;;
  *) printf '%s\n' "$result"; exit 0 ;;   # Success: nothing to do
esac
if [ "$attempt" -lt "${MAX_ATTEMPTS:?set MAX_ATTEMPTS in the hook command}" ]; then
  echo "give_up.sh: attempt $attempt of $MAX_ATTEMPTS failed; letting drover retry" >&2
  printf '%s\n' "$result"
  exit 0
fi
# drover prints results as compact JSON with "error" last, so the error can be copied out as a
# JSON string literal, escapes and all, without decoding it. (A Timeout has no error.)
error=$(printf '%s\n' "$result" | sed -n -E 's/.*,"error":("([^"\\]|\\.)*")}$/\1/p')
[ -n "$error" ] || error='"timed out"'
echo "give_up.sh: attempt $attempt was the last one; handing over to Recover" >&2
printf '{"kind": "Success", "output": [], "next": [{"kind": "Recover", "value": {"task": "%s", "attempts": %d, "error": %s}}]}\n' \
  "${DROVER_TASK_ID:-unknown}" "$attempt" "$error"
