#!/bin/sh
# Action of step Split: fans out into `count` Work tasks (default 3).
# stdin:  {"kind": "Split", "value": {"count": 3, "review": false}}
# stdout: [{"kind": "Work", "value": {"index": 1, "review": false}}, … up to index 3]
set -eu
task=$(cat)
count=$(printf '%s\n' "$task" | sed -n 's/.*"count"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
[ -n "$count" ] || count=3
review=false
if printf '%s\n' "$task" | grep -q '"review"[[:space:]]*:[[:space:]]*true'; then
  review=true
fi
printf '['
i=1
separator=''
while [ "$i" -le "$count" ]; do
  printf '%s{"kind": "Work", "value": {"index": %d, "review": %s}}' "$separator" "$i" "$review"
  separator=', '
  i=$((i + 1))
done
printf ']\n'
echo "split.sh: emitted $count Work tasks" >&2
