#!/bin/sh
# Runs examples/refactor from anywhere: ./run.sh REPO [GLOB] [CHECK] [GOAL]
#
#   REPO   the repository to refactor. Commit first: agents edit files in place, and
#          `git diff` is then exactly what they did.
#   GLOB   which files to analyze, matched against file names (default: '*.rs')
#   CHECK  shell command that must pass after every change, run in REPO (default:
#          'cargo check'); $FILE names the changed file, e.g. 'sh -n "${FILE:-run.sh}"'
#   GOAL   what the refactoring is for, in plain words (default: readability)
#
# Needs jq, a running pool daemon and agents attached to it; this script checks the daemon
# and tells you how to start both if it is not up. The report is written to
# reports/refactor-RUN_ID.md in this directory.
#
#   DROVER           the drover program (default: `drover` on PATH)
#   DROVER_POOL_BIN  the drover-pool program (default: `drover-pool` on PATH), e.g.
#                    DROVER=../../target/release/drover DROVER_POOL_BIN=../../target/release/drover-pool ./run.sh ~/src/app
#   DROVER_POOL, DROVER_ROOT, DROVER_STATE_DIR  passed on as usual
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

if [ $# -lt 1 ] || [ $# -gt 4 ]; then
  echo "usage: $0 REPO [GLOB] [CHECK] [GOAL]   e.g. $0 ~/src/app '*.rs' 'cargo check'" >&2
  exit 2
fi
if ! command -v jq >/dev/null 2>&1; then
  echo "run.sh: the scripts of this example need jq (https://jqlang.org); install it first" >&2
  exit 127
fi
# REPO is relative to where you are, so make it absolute before leaving.
repo=$(cd "$1" 2>/dev/null && pwd) || { echo "run.sh: no such directory: $1" >&2; exit 2; }
glob=${2:-'*.rs'}
check=${3:-cargo check}
goal=${4:-}
value=$(jq -n -c --arg root "$repo" --arg glob "$glob" --arg check "$check" --arg goal "$goal" \
  '{root: $root, glob: $glob, check: $check} + (if $goal == "" then {} else {goal: $goal} end)')

DROVER=$(abspath "${DROVER:-drover}")
POOL_BIN=$(abspath "${DROVER_POOL_BIN:-drover-pool}")
cd "$(dirname "$0")"
DROVER=$(abspath "$DROVER")
POOL_BIN=$(abspath "$POOL_BIN")
for program in "$DROVER" "$POOL_BIN"; do
  if ! command -v "$program" >/dev/null 2>&1; then
    echo "run.sh: cannot find \`$program\`: install drover (\`cargo install --path .\` in the repository) or set DROVER and DROVER_POOL_BIN" >&2
    exit 127
  fi
done
# The finally hook (report.sh) reads the run back with this same drover.
export DROVER

if ! "$POOL_BIN" status >/dev/null 2>&1; then
  cat >&2 <<EOT
run.sh: the refactor steps are done by agents, but no pool daemon is running.

1. Start one, in another terminal (it stays in the foreground):

     $POOL_BIN start

2. Start two or three agents (Claude Code, Codex, aider, …), each in its own terminal and
   working directory with access to $repo, each told:

     You are a drover agent named agent-1. Run \`drover-pool protocol --name agent-1\`,
     read what it prints, and follow it until you receive \`Kicked\`.

   (agent-2, agent-3, … for the others: every agent needs its own name.)

3. Run this script again.
EOT
  exit 1
fi
echo "run.sh: the pool daemon is up:"
"$POOL_BIN" status
if [ "$("$POOL_BIN" status --json | jq '.agents | length')" -eq 0 ]; then
  echo "run.sh: no agent is attached yet: tasks wait in the queue until one is (see \`drover-pool protocol --name agent-1\`)"
fi

echo "run.sh: examples/refactor: agents refactor the files \`$glob\` in $repo; \`$check\` must pass before and after every change"
echo "run.sh: $DROVER run --config workflow.jsonc --entrypoint-value '$value'"
status=0
"$DROVER" run --config workflow.jsonc --entrypoint-value "$value" || status=$?
echo "run.sh: drover exited with $status (0: every change passed the check). The report is in $(pwd)/reports/; \`git -C $repo diff\` shows the changes."
exit "$status"
