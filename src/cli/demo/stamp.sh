#!/bin/sh
# Pre hook: add a field to the task value (stdin: the value; stdout: the new value).
sed 's/}[[:space:]]*$/,"checked_by":"pre-hook"}/'
