#!/usr/bin/env bash
# Runs a multi-process job and checks how it ends: the reliability ctest entries use it to assert
# that a job with a failing rank exits non-zero within a bound (never hangs) and says why.
#   expect_job_failure.sh SECONDS EXPECT REGEX... -- COMMAND...
# EXPECT: "nonzero" (the job must fail) or "zero" (the control run must succeed). Every REGEX
# (grep -E) must match the job's combined output. A job still running after SECONDS is killed and
# fails the test. A job that exits 77 is skipped (ctest SKIP_RETURN_CODE 77). A sanitizer report
# in the output fails the test even where the job was expected to fail (it would hide there).
set -uo pipefail
limit=$1 expect=$2
shift 2
regexes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do regexes+=("$1"); shift; done
shift
out=$(mktemp)
start=$(date +%s%N)
timeout --kill-after=5 "$limit" "$@" >"$out" 2>&1
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$out"
echo "== exit code $rc after ${elapsed_ms} ms (limit ${limit} s)"
fail() { echo "== FAILED: $*"; rm -f "$out"; exit 1; }
if grep -q "^skipped: " "$out"; then rm -f "$out"; exit 77; fi
if grep -Eq "^(==[0-9]+==ERROR: AddressSanitizer|WARNING: ThreadSanitizer)|runtime error: " "$out"; then
  fail "a sanitizer reported an error (see above)"
fi
if [ "$elapsed_ms" -ge $((limit * 1000)) ]; then fail "the job hung: still running after ${limit} s"; fi
if [ "$expect" = nonzero ] && [ "$rc" = 0 ]; then fail "expected a non-zero exit"; fi
if [ "$expect" = zero ] && [ "$rc" != 0 ]; then fail "expected exit 0"; fi
for r in "${regexes[@]}"; do grep -Eq "$r" "$out" || fail "the output does not match /$r/"; done
rm -f "$out"
echo "== passed"
