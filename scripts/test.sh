#!/usr/bin/env bash
# `make test`: the test parts one after the other (each a make target), stopping at the first that fails, and
# at the end each part's wall time, so that the CI's time budget shows where it goes.
#   bash scripts/test.sh test-asan test-fast test-fuzz
set -uo pipefail
cd "$(dirname "$0")/.."
report=()
status=0
for part in "$@"; do
  start=$(date +%s)
  make --no-print-directory "$part"
  status=$?
  report+=("$part $(($(date +%s) - start)) s$([ $status -eq 0 ] || echo ' (failed)')")
  [ $status -eq 0 ] || break
done
echo "make test: wall time per part:"
printf '  %s\n' "${report[@]}"
exit $status
