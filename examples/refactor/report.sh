#!/bin/sh
# `finally` hook of step ListFiles: writes a Markdown report of the whole run.
# It runs once, after ListFiles and every task descending from it (all Analyze, ProposeFix,
# Apply, Verify and Repair tasks) have completed or failed, and also when ListFiles itself
# failed (e.g. the baseline check failed).
# stdin:  the ListFiles value, e.g. {"root": "/abs/repo", "glob": "*.rs", "check": "cargo check"}
# stdout: [] (a finally hook may spawn tasks; this one does not)
#
# The report goes to `report` from the value, else reports/refactor-RUN_ID.md next to
# workflow.jsonc (a relative path is relative to this directory). What happened is read back
# with `drover inspect` from the run's own state: DROVER (else `drover` on PATH) must be the
# drover that runs this workflow; examples/refactor/run.sh sets it.
set -u
command -v jq >/dev/null 2>&1 || { echo "report.sh: jq is required (https://jqlang.org)" >&2; printf '[]\n'; exit 0; }
value=$(cat)
get() { printf '%s\n' "$value" | jq -r "$1"; }
run=${DROVER_RUN_ID:-unknown}
report=$(get '.report // empty')
[ -n "$report" ] || report="reports/refactor-$run.md"
mkdir -p "$(dirname "$report")"
drover=${DROVER:-drover}
inspect() { "$drover" inspect "$run" --state-dir "${DROVER_STATE_DIR:-}" "$@" 2>/dev/null; }

{
  printf '# Refactor report, run %s\n\n' "$run"
  printf '%s\n' "- repository: \`$(get .root)\`" "- files: \`$(get .glob)\`" "- check: \`$(get .check)\`"
  printf '%s\n\n' "- goal: $(get '.goal // "(the default: readability and maintainability)"')"

  if ! summary=$(inspect --tree --json); then
    printf 'No details: `%s inspect` could not read the run. Try `drover inspect %s`.\n' "$drover" "$run"
  else
    printf '## Tasks per step\n\n| step | completed | failed |\n|---|---|---|\n'
    printf '%s\n' "$summary" | jq -r '.steps[] | "| \(.step) | \(.completed) | \(.failed) |"'

    printf '\n## Changes and their checks\n\n'
    # Every Verify task stands for one applied change (round 1) or one repair (round 2).
    ids=$(printf '%s\n' "$summary" | jq -r '.tree | .. | objects | select(.step? == "Verify") | .id')
    if [ -z "$ids" ]; then
      printf 'No change was applied.\n'
    fi
    for id in $ids; do
      inspect --task "$id" --json | jq -r '
        (.value.round // 1) as $round
        | (if .state == "failed" then "check FAILED: \(.error // "?")"
           elif (.result.next // []) | length > 0 then "check failed, sent to Repair"
           elif .state == "completed" then "check passed"
           else .state end) as $outcome
        | "- `\(.value.file)`: \(.value.title) (round \($round)): \($outcome)"'
    done

    printf '\n## Failures\n\n'
    printf '%s\n' "$summary" | jq -r '
      if (.failures | length) == 0 then "None."
      else .failures[] | "- \(.step) `\(.task)` after \(.attempts) attempt(s): \(.error)" end'
  fi
  printf '\nDetails: `drover inspect %s --tree`, then `drover inspect %s --task TASK_ID`.\n' "$run" "$run"
} >"$report.tmp" && mv "$report.tmp" "$report"

echo "report.sh: wrote $report" >&2
printf '[]\n'
