#!/usr/bin/env bash
# Runs sanitizer_canary KIND and passes only when the sanitizer reported (REGEX matches) and the
# process exited non-zero, as ctest needs to see a report as a failure.
#   expect_sanitizer_report.sh REGEX PROGRAM KIND
set -uo pipefail
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
echo "$out"
echo "== exit code $rc"
[ "$rc" != 0 ] || { echo "== FAILED: the canary exited 0 (a report would not fail a test)"; exit 1; }
grep -Eq "$regex" <<<"$out" || { echo "== FAILED: no report matching /$regex/"; exit 1; }
echo "== passed"
