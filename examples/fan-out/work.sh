#!/bin/sh
# Action of step Work: squares its index; passes the result to Review when asked to.
# stdin:  {"kind": "Work", "value": {"index": 2, "review": true}}
# stdout: [{"kind": "Review", "value": {"index": 2, "square": 4}}]   (or [] without review)
set -eu
task=$(cat)
index=$(printf '%s\n' "$task" | sed -n 's/.*"index"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
square=$((index * index))
echo "work.sh: $index squared is $square" >&2
if printf '%s\n' "$task" | grep -q '"review"[[:space:]]*:[[:space:]]*true'; then
  printf '[{"kind": "Review", "value": {"index": %d, "square": %d}}]\n' "$index" "$square"
else
  printf '[]\n'
fi
