#!/bin/sh
# Post hook of step Verify: a failed check becomes a Repair task for an agent, once.
# stdin:  the result of the Verify attempt: {"kind": "Success" | "Error" | "Timeout", "input": {…}, …}
# stdout: the result drover uses instead
#
#   Success                            passed through: the check passed.
#   Error/Timeout, round < MAX_ROUNDS  replaced by a Success whose `next` is a Repair task. The
#                                      Verify task completes; Repair answers with a new Verify
#                                      of round + 1, which has the final word.
#   Error/Timeout, round >= MAX_ROUNDS passed through: the Verify task fails, and the run ends
#                                      with exit code 1 and the failure in `drover inspect`.
#
# MAX_ROUNDS is set in workflow.jsonc, next to the `maximum` of Verify's `round`.
set -eu
command -v jq >/dev/null 2>&1 || { echo "after_verify.sh: jq is required (https://jqlang.org)" >&2; exit 1; }
result=$(cat)
kind=$(printf '%s\n' "$result" | jq -r '.kind')
round=$(printf '%s\n' "$result" | jq -r '.input.round // 1')
max=${MAX_ROUNDS:-2}
if [ "$kind" = Success ] || [ "$round" -ge "$max" ]; then
  [ "$kind" = Success ] || echo "after_verify.sh: round $round failed too; giving up on this change" >&2
  printf '%s\n' "$result"
  exit 0
fi
echo "after_verify.sh: round $round: $kind; asking an agent to repair" >&2
printf '%s\n' "$result" | jq -c '{
  kind: "Success",
  input: .input,
  output: [],
  next: [{kind: "Repair", value: {
    root: .input.root, file: .input.file, check: .input.check, title: .input.title,
    round: (.input.round // 1),
    error: (.error // "the check timed out")
  }}]
}'
