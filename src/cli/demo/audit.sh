#!/bin/sh
# Post hook: record the result and pass it through unchanged.
tee -a audit.log
echo >> audit.log
