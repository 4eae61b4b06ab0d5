#!/bin/sh
# Finally hook of Plan: every Analyze, Fix and Verify below it has settled.
cat > /dev/null
verified=$(grep -c '"kind":"Success"' audit.log 2>/dev/null || echo 0)
echo "summary: $verified fixes verified" >&2
echo "$verified" > summary.txt
echo '[]'
