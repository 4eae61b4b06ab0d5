#!/bin/sh
# Runs examples/retries from anywhere: ./run.sh [--slow]
#
#   (no flag)  Flaky succeeds on attempt 3 (after 1 s and 2 s of backoff), Garbled on attempt 2
#              (its first answer is invalid), Slow at once, and Fragile gives up after 2
#              attempts, its post hook turning that into a Recover task. Exit code 0.
#   --slow     Slow overruns its 3 s timeout and, with retry_on_timeout false, fails at once
#              without a retry. Exit code 1 (a task failed).
#
#   DROVER     the drover program (default: `drover` on PATH), e.g.
#              DROVER=../../target/release/drover ./run.sh
set -eu

abspath() {
  case $1 in
    /*) printf '%s\n' "$1" ;;
    */*) if [ -e "$1" ]; then
           printf '%s/%s\n' "$(cd "$(dirname "$1")" && pwd)" "$(basename "$1")"
         else
           printf '%s\n' "$1"
         fi ;;
    *) printf '%s\n' "$1" ;;
  esac
}
DROVER=$(abspath "${DROVER:-drover}")
cd "$(dirname "$0")"
DROVER=$(abspath "$DROVER")
if ! command -v "$DROVER" >/dev/null 2>&1; then
  echo "run.sh: cannot find \`$DROVER\`: install drover (\`cargo install --path .\` in the repository) or set DROVER=/path/to/drover" >&2
  exit 127
fi

case ${1:-} in
  '')
    value='{}'
    echo "run.sh: examples/retries: backoff, an invalid answer retried, a final failure turned into a recovery task (about 3 s; expect exit code 0)" ;;
  --slow)
    value='{"slow": true}'
    echo "run.sh: examples/retries: as without --slow, but Slow times out and is not retried (expect exit code 1)" ;;
  *)
    echo "usage: $0 [--slow]" >&2
    exit 2 ;;
esac
echo "run.sh: $DROVER run --config workflow.jsonc --entrypoint-value '$value'"
status=0
"$DROVER" run --config workflow.jsonc --entrypoint-value "$value" || status=$?
echo "run.sh: drover exited with $status. \`drover inspect RUN_ID --task TASK_ID\` shows every attempt of a task, its error and its delay."
exit "$status"
