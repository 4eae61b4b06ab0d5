#!/bin/sh
# Plan: one Analyze task per file (stdin, the Plan task, is not needed here).
cat > /dev/null
printf '['
first=1
for f in src/lib.rs src/parser.rs src/flaky.rs src/cli.rs src/store.rs src/net.rs; do
  [ $first = 1 ] || printf ','
  first=0
  printf '{"kind":"Analyze","value":{"file":"%s"}}' "$f"
done
printf ']\n'
