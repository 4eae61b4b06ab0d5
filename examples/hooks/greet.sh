#!/bin/sh
# Action of step Greet. Fails on purpose when the value has "fail": true, to show the post hook
# and the retry policy at work.
# stdin:  {"kind": "Greet", "value": {"name": "drover", "received_at": "…"}}
# stdout: [{"kind": "Done", "value": {"greeting": "hello, drover", "received_at": "…"}}]
set -eu
task=$(cat)
if printf '%s\n' "$task" | grep -q '"fail"[[:space:]]*:[[:space:]]*true'; then
  echo "greet.sh: failing on purpose (attempt ${DROVER_ATTEMPT:-?})" >&2
  exit 1
fi
field() {
  printf '%s\n' "$task" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"\\\\]*\\)\".*/\\1/p" | head -n 1
}
name=$(field name)
received=$(field received_at)
printf '[{"kind": "Done", "value": {"greeting": "hello, %s", "received_at": "%s"}}]\n' \
  "${name:-world}" "${received:-unknown}"
