#!/bin/sh
# Runs examples/hooks from anywhere: ./run.sh [--fail]
#
#   (no flag)  Greet succeeds: the pre hook stamps the value, Done prints it. Exit code 0.
#   --fail     Greet fails 3 times (1 s, then 2 s apart); the post hook adds a Recover task,
#              which runs once Greet has failed for good. Exit code 1 (a task failed).
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
    value='{"name": "drover"}'
    echo "run.sh: examples/hooks: a pre hook adds a timestamp, Greet succeeds, Done prints it (expect exit code 0)" ;;
  --fail)
    value='{"name": "drover", "fail": true}'
    echo "run.sh: examples/hooks: Greet fails on every attempt; after the last one the post hook's Recover task runs (expect exit code 1)" ;;
  *)
    echo "usage: $0 [--fail]" >&2
    exit 2 ;;
esac
echo "run.sh: $DROVER run --config workflow.jsonc --entrypoint-value '$value'"
status=0
"$DROVER" run --config workflow.jsonc --entrypoint-value "$value" || status=$?
echo "run.sh: drover exited with $status. \`drover inspect RUN_ID --tree\` shows the tasks, \`--task TASK_ID\` their hooks."
exit "$status"
