#!/usr/bin/env bash
# Whole-process benchmarks of drover, run by hand (never in CI):
#   bash bench/run.sh            # all benchmarks
#   bash bench/run.sh fanout     # one of: fanout pool chain big resume inspect commit
# Prints one table row per benchmark. Needs python3 and GNU time (/usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=$PWD/target/release
WORK=$(mktemp -d /tmp/drover-bench.XXXXXX)
POOLS=()
cleanup() {
  for pid in "${POOLS[@]}"; do kill "$pid" 2>/dev/null || true; done
  pkill -f "drover-pool agent --name bench-" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
SELECTED=${1:-all}
want() { [[ $SELECTED == all || $SELECTED == "$1" ]]; }
row() { printf '| %-44s | %8s | %9s | %9s | %10s | %s\n' "$@"; }
now_ns() { date +%s%N; }

# Runs "$@" under GNU time; sets WALL (seconds) and RSS_MB.
measure() {
  local log=$WORK/time.$$
  /usr/bin/time -v "$@" 2>"$log" >/dev/null || { tail -5 "$log"; return 1; }
  WALL=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,p,":"); s=0; for(i=1;i<=n;i++) s=s*60+p[i]; print s}' "$log")
  RSS_MB=$(awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2/1024}' "$log")
}

fanout_config() { # $1 = dir, $2 = count, $3 = action kind (Command|Pool), $4 = max_concurrency
  mkdir -p "$1"
  # The answer is written beforehand so the one Split process costs a `cat`, not a Python
  # start-up (150 ms through pyenv's shim), which would be charged to drover's wall time.
  python3 -c "import json; print(json.dumps([{'kind': 'Item', 'value': {'i': i}} for i in range($2)]))" > "$1/items.json"
  local action='{"kind": "Command", "script": "echo []"}'
  [[ $3 == Pool ]] && action='{"kind": "Pool", "instructions": "answer []"}'
  cat > "$1/workflow.jsonc" <<JSON
{
  "entrypoint": "Split",
  "max_concurrency": $4,
  "steps": [
    {"name": "Split", "action": {"kind": "Command", "script": "cat items.json"}, "next": ["Item"]},
    {"name": "Item", "action": $action, "next": []}
  ]
}
JSON
}

bare_rate() { # bare `sh -c 'echo []'` spawns, 16 at a time
  local start end
  start=$(now_ns)
  seq "$1" | xargs -P 16 -I{} sh -c 'echo []' >/dev/null
  end=$(now_ns)
  python3 -c "print(round($1 / (($end - $start) / 1e9)))"
}

start_pool() { # $1 = root
  "$BIN/drover-pool" start --root "$1" 2>/dev/null &
  POOLS+=($!)
  for _ in $(seq 100); do "$BIN/drover-pool" status --root "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "pool did not start" >&2; return 1
}

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(uname -sr); $(date -u +%F)"
row "benchmark" "tasks" "wall s" "tasks/s" "peak RSS MB" "notes"
row "---" "---" "---" "---" "---" "---"

if want fanout || want pool; then
  BARE=$(bare_rate 10000)
  row "bare sh -c 'echo []', xargs -P 16" 10000 "-" "$BARE" "-" "the physical limit"
fi

if want fanout; then
  d=$WORK/fanout; fanout_config "$d" 10000 Command 16
  measure "$BIN/drover" run --config "$d/workflow.jsonc" --state-dir "$d/state"
  rate=$(python3 -c "print(round(10001 / $WALL))")
  row "fan-out 10,000 Command, max_concurrency 16" 10001 "$WALL" "$rate" "$RSS_MB" "$(python3 -c "print(f'{$rate / $BARE:.2f} x bare (target >= 0.8)')")"
fi

if want pool; then
  d=$WORK/pool; fanout_config "$d" 2000 Pool 64; start_pool "$d/root"
  for i in $(seq 16); do
    "$BIN/drover-pool" agent --name "bench-$i" --root "$d/root" -- sh -c 'echo []' 2>/dev/null &
  done
  measure "$BIN/drover" run --config "$d/workflow.jsonc" --state-dir "$d/state" --root "$d/root"
  "$BIN/drover-pool" stop --root "$d/root" >/dev/null 2>&1 || true
  rate=$(python3 -c "print(round(2001 / $WALL))")
  row "fan-out 2,000 Pool, 16 agents" 2001 "$WALL" "$rate" "$RSS_MB" "$(python3 -c "print(f'{$rate / $BARE:.2f} x bare (target >= 0.6)')")"
fi

if want chain; then
  d=$WORK/chain; mkdir -p "$d"; start_pool "$d/root"
  cat > "$d/workflow.jsonc" <<'JSON'
{"entrypoint": "Link", "steps": [{"name": "Link", "value_schema": {"type": "object", "required": ["n"]},
  "action": {"kind": "Pool", "instructions": "pass it on"}, "next": ["Link"]}]}
JSON
  # The agent logs when its own work starts and ends; the gap from one task's end to the
  # next task's start is drover's dispatch-to-dispatch overhead (plus one `sh` start-up).
  cat > "$d/agent.sh" <<'SH'
#!/bin/sh
start=$(date +%s%N)
n=$(sed -n 's/.*"value":{"n":\([0-9]*\)}.*/\1/p')
if [ "$n" -ge 200 ]; then echo '[]'; else echo "[{\"kind\":\"Link\",\"value\":{\"n\":$((n+1))}}]"; fi
echo "$n $start $(date +%s%N)" >> "$AGENT_LOG"
SH
  chmod +x "$d/agent.sh"
  AGENT_LOG=$d/agent.log "$BIN/drover-pool" agent --name bench-chain --root "$d/root" -- "$d/agent.sh" 2>/dev/null &
  measure "$BIN/drover" run --config "$d/workflow.jsonc" --entrypoint-value '{"n": 1}' --state-dir "$d/state" --root "$d/root"
  "$BIN/drover-pool" stop --root "$d/root" >/dev/null 2>&1 || true
  overhead=$(python3 -c "
import statistics
rows = sorted((int(n), int(s), int(e)) for n, s, e in (l.split() for l in open('$d/agent.log')))
gaps = [(b[1] - a[2]) / 1e6 for a, b in zip(rows, rows[1:])]
print(f'{statistics.median(gaps):.2f}')")
  # The script's own start-up (sh, then its first `date`) sits inside each gap; measured alone.
  startup=$(python3 -c "
import statistics, subprocess, time
samples = []
for _ in range(50):
    t0 = time.time_ns()
    out = subprocess.run(['sh', '-c', 'date +%s%N'], capture_output=True, text=True).stdout
    samples.append((int(out) - t0) / 1e6)
print(f'{statistics.median(samples):.2f}')")
  net=$(python3 -c "print(f'{$overhead - $startup:.2f}')")
  row "linear chain of 200 Pool steps, 1 agent" 200 "$WALL" "-" "$RSS_MB" "median gap ${overhead} ms - script start-up ${startup} ms = ${net} ms overhead (target <= 5)"
fi

if want big; then
  d=$WORK/big; fanout_config "$d" 100000 Command 16
  measure "$BIN/drover" run --config "$d/workflow.jsonc" --state-dir "$d/state"
  row "fan-out 100,000 Command" 100001 "$WALL" "$(python3 -c "print(round(100001 / $WALL))")" "$RSS_MB" "target: peak RSS < 100 MB"
fi

if want resume; then
  d=$WORK/resume; mkdir -p "$d"
  cat > "$d/workflow.jsonc" <<'JSON'
{"entrypoint": "Split", "max_concurrency": 16, "steps": [
  {"name": "Split", "action": {"kind": "Command", "script": "python3 -c 'import json; print(json.dumps([{\"kind\": \"Item\", \"value\": {\"i\": i}} for i in range(100000)]))'"}, "next": ["Item"]},
  {"name": "Item", "action": {"kind": "Command", "script": "date +%s%N >> started.log; echo []"}, "next": []}]}
JSON
  cd "$d"
  "$BIN/drover" run --config workflow.jsonc --state-dir "$d/state" 2>/dev/null &
  runner=$!
  while [[ ! -f $d/started.log || $(wc -l < "$d/started.log") -lt 20000 ]]; do sleep 0.2; done
  kill -9 "$runner"; wait "$runner" 2>/dev/null || true
  # Commands the killed runner started live on in their own process groups; let them finish.
  prev=-1; lines=$(wc -l < "$d/started.log")
  while [[ $lines != "$prev" ]]; do sleep 0.5; prev=$lines; lines=$(wc -l < "$d/started.log"); done
  t0=$(now_ns)
  "$BIN/drover" resume --state-dir "$d/state" 2>/dev/null &
  runner=$!
  while [[ $(wc -l < "$d/started.log") -le $lines ]]; do sleep 0.005; done
  t1=$(sed -n "$((lines + 1))p" "$d/started.log")
  kill -9 "$runner"; wait "$runner" 2>/dev/null || true
  cd - >/dev/null
  row "resume of a killed 100,000-task run" 100001 "-" "-" "-" "$(python3 -c "print(f'first dispatch {($t1 - $t0) / 1e9:.3f} s after start (target < 2)')")"
fi

if want inspect; then
  d=$WORK/inspect; mkdir -p "$d"
  echo '{"entrypoint": "A", "steps": [{"name": "A", "action": {"kind": "Command", "script": "echo []"}, "next": []}]}' > "$d/workflow.jsonc"
  for _ in $(seq 1000); do "$BIN/drover" run --config "$d/workflow.jsonc" --state-dir "$d/state" 2>/dev/null; done
  best=999999
  for _ in 1 2 3 4 5; do
    s=$(now_ns); "$BIN/drover" inspect --state-dir "$d/state" >/dev/null; e=$(now_ns)
    ms=$(( (e - s) / 1000000 )); (( ms < best )) && best=$ms
  done
  row "inspect runs list, 1,000 runs stored" 1000 "-" "-" "-" "best of 5: ${best} ms (target < 200)"
fi

if want commit; then
  # The disk's raw durable commit rate through redb, for reading the numbers above.
  cargo run --release --quiet --example commit_rate -- "$WORK/commit.redb"
fi
