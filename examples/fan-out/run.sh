#!/bin/sh
# Runs examples/fan-out from anywhere: ./run.sh [--review] [COUNT]
#
#   (no flag)  Split fans out into COUNT (default 5) Work tasks, at most 2 in flight at once;
#              the finally hook summarizes once all are done. Review is a Pool step, so
#              drover wants a pool daemon even though no Review task is created: this script
#              starts a private one for the run and stops it afterwards. No agent is needed.
#   --review   Every Work task also hands its result to an agent for review. That needs the
#              pool daemon you run (`drover-pool start`) and at least one agent attached to it;
#              this script checks the daemon and tells you how to start both if it is not up.
#
#   DROVER           the drover program (default: `drover` on PATH)
#   DROVER_POOL_BIN  the drover-pool program (default: `drover-pool` on PATH), e.g.
#                    DROVER=../../target/release/drover DROVER_POOL_BIN=../../target/release/drover-pool ./run.sh
#   DROVER_POOL, DROVER_ROOT, DROVER_STATE_DIR  passed on as usual (for --review)
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

review=false
count=5
for arg in "$@"; do
  case $arg in
    --review) review=true ;;
    *[!0-9]* | '') echo "usage: $0 [--review] [COUNT]" >&2; exit 2 ;;
    *) count=$arg ;;
  esac
done
value=$(printf '{"count": %d, "review": %s}' "$count" "$review")

if [ "$review" = true ]; then
  if ! "$POOL_BIN" status >/dev/null 2>&1; then
    cat >&2 <<EOT
run.sh: --review hands every Work result to an agent, but no pool daemon is running.

1. Start one, in another terminal (it stays in the foreground):

     $POOL_BIN start

2. Attach at least one agent. A scripted one that approves everything:

     $POOL_BIN agent --name reviewer -- sh -c 'cat >/dev/null; echo []'

   or an LLM agent (Claude Code, Codex, …), told:

     You are a drover agent named agent-1. Run \`drover-pool protocol --name agent-1\`,
     read what it prints, and follow it until you receive \`Kicked\`.

3. Run this script again: $0 --review $count
EOT
    exit 1
  fi
  echo "run.sh: the pool daemon is up:"
  "$POOL_BIN" status
  echo "run.sh: examples/fan-out: Split → $count Work tasks → $count Review tasks for the agents above (stop them with \`drover-pool kick --name NAME\`)"
  echo "run.sh: $DROVER run --config workflow.jsonc --entrypoint-value '$value'"
  status=0
  "$DROVER" run --config workflow.jsonc --entrypoint-value "$value" || status=$?
else
  # A private pool in a fresh directory (short path: the socket path has a length limit).
  root=$(mktemp -d /tmp/drover-fan-out.XXXXXX)
  echo "run.sh: starting a private pool daemon for this run: $POOL_BIN start --root $root"
  "$POOL_BIN" start --root "$root" >"$root/daemon.log" 2>&1 &
  daemon=$!
  cleanup() {
    "$POOL_BIN" stop --root "$root" >/dev/null 2>&1 || kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    rm -rf "$root"
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  echo "run.sh: examples/fan-out: Split → $count Work tasks, at most 2 at a time, then the finally hook"
  # drover waits up to --pool-wait seconds (default 10) for the daemon to come up.
  echo "run.sh: $DROVER run --config workflow.jsonc --root $root --entrypoint-value '$value'"
  status=0
  "$DROVER" run --config workflow.jsonc --root "$root" --entrypoint-value "$value" || status=$?
fi
echo "run.sh: drover exited with $status (0: every task completed). \`drover inspect RUN_ID --tree\` shows the fan-out."
exit "$status"
