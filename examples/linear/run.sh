#!/bin/sh
# Runs examples/linear from anywhere: ./run.sh [NAME]
#
#   DROVER     the drover program (default: `drover` on PATH), e.g.
#              DROVER=../../target/release/drover ./run.sh
#              (a relative path may be relative to your directory or to this one)
#   DROVER_STATE_DIR, …  passed on to drover as usual
set -eu

# A program given as a relative path: absolute, relative to the current directory if it is
# there, else left for the second try after the cd below.
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

name=${1:-drover}
value=$(printf '{"name": "%s"}' "$name")
echo "run.sh: examples/linear: three Command steps in a chain, Greet → Shout → Print, for \"$name\""
echo "run.sh: $DROVER run --config workflow.jsonc --entrypoint-value '$value'"
status=0
"$DROVER" run --config workflow.jsonc --entrypoint-value "$value" || status=$?
echo "run.sh: drover exited with $status (0: every task completed). \`drover inspect\` lists the runs."
exit "$status"
