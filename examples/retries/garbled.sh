#!/bin/sh
# Action of step Garbled: its first answer is not a JSON array, which drover rejects as an
# invalid response; the retry (allowed by "retry_on_invalid_response": true) answers correctly.
# An invalid response is any answer that is not an array of valid tasks: not JSON, not an
# array, a kind missing from `next`, or a value that fails its step's value_schema.
# stdin:  {"kind": "Garbled", "value": {}}
# stdout: attempt 1: {"status": "ok"}   (an object, not an array: invalid)
#         later:     []
set -eu
cat >/dev/null
if [ "${DROVER_ATTEMPT:-1}" -eq 1 ]; then
  echo "garbled.sh: attempt 1: answering with an object instead of an array" >&2
  printf '{"status": "ok"}\n'
else
  echo "garbled.sh: attempt ${DROVER_ATTEMPT}: answering correctly" >&2
  printf '[]\n'
fi
