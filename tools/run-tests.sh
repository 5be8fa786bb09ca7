#!/usr/bin/env bash
# `make test`: runs every test through ctest with a private temp directory,
# then lists anything a test left there (tests clean up what they create,
# also when they fail) and fails the run if there is any.
set -euo pipefail
build="${1:-build}"
jobs="${2:-$(nproc)}"
tmp="$(mktemp -d /tmp/shoal-tests.XXXXXX)"
export TMPDIR="$tmp" TEST_TMPDIR="$tmp"
# The trainers' GEMM peak for MFU (runtime/peak.h), measured once for the
# run under the suite's load: kept out of the user's own cache.
export SHOAL_PEAK_CACHE="$tmp/peak.json"
rc=0
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 600) || rc=$?
# Only our own names: OpenMPI and Slurm keep session files of their own.
left="$(find "$tmp" -mindepth 1 -maxdepth 1 -name 'shoal*' | sort)"
if [ -n "$left" ]; then
  echo "make test: the tests left these behind in the temp directory:"
  echo "$left" | sed 's/^/  /'
  [ "$rc" -ne 0 ] || rc=1
fi
rm -rf "$tmp"
exit "$rc"
