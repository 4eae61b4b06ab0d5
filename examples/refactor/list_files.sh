#!/bin/sh
# Action of step ListFiles: one Analyze task per file under `root` whose name matches `glob`.
# stdin:  {"kind": "ListFiles", "value": {"root": "/abs/repo", "glob": "*.rs", "check": "cargo check", …}}
# stdout: [{"kind": "Analyze", "value": {"root": "/abs/repo", "file": "src/lib.rs", "goal": "…", "check": "cargo check"}}, …]
#
# `glob` is matched against file names (find -name), in every directory except hidden ones
# (.git, .venv, …) and the usual build and dependency directories. Paths in the answer are
# relative to root, in sorted order, at most `max_files` (default 20) of them. No match at
# all answers [], which ends the run after the finally hook.
set -eu
command -v jq >/dev/null 2>&1 || { echo "list_files.sh: jq is required (https://jqlang.org)" >&2; exit 1; }
task=$(cat)
value=$(printf '%s\n' "$task" | jq -c '.value')
root=$(printf '%s\n' "$value" | jq -r '.root')
glob=$(printf '%s\n' "$value" | jq -r '.glob')
max=$(printf '%s\n' "$value" | jq -r '.max_files // 20')
cd "$root" || { echo "list_files.sh: cannot enter root $root" >&2; exit 1; }
root=$(pwd -P)
files=$(find . \
  \( -type d ! -name . \( -name '.*' -o -name target -o -name node_modules -o -name vendor \
      -o -name dist -o -name build -o -name __pycache__ \) -prune \) \
  -o -type f -name "$glob" -print | sed 's|^\./||' | LC_ALL=C sort)
count=$(printf '%s' "$files" | grep -c '' || true)
if [ "$count" -gt "$max" ]; then
  echo "list_files.sh: $count files match \`$glob\`; analyzing the first $max (raise max_files for more)" >&2
fi
printf '%s\n' "$files" | head -n "$max" | jq -R -s -c \
  --arg root "$root" \
  --arg default_goal "Make the code easier to read and maintain without changing what it does: remove duplication, split functions that do too much, rename unclear names, delete dead code, simplify convoluted control flow." \
  --argjson v "$value" '
  split("\n") | map(select(length > 0))
  | map({kind: "Analyze",
         value: {root: $root, file: ., goal: ($v.goal // $default_goal), check: $v.check}})'
echo "list_files.sh: $(( count < max ? count : max )) file(s) to analyze under $root" >&2
