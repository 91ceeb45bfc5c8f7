#!/usr/bin/env bash
# The short fuzz run of CI (issue #14): builds every target and runs each for a few seconds over the
# committed corpus (a debug build: quick to compile), writing what it finds under a temporary directory
# (never into the repo). A crash
# fails the step and leaves its input under fuzz/artifacts/<target>/. The long run is in docs/fuzzing.md.
# Needs the nightly toolchain; installs cargo-fuzz when it is missing.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-5}"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
start=$(date +%s)
cargo +nightly fuzz build --dev
echo "fuzz: targets built in $(( $(date +%s) - start )) s"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in $(cargo +nightly fuzz list); do
  mkdir -p "$work/$t"
  echo "fuzz: $t for ${SECONDS_PER_TARGET} s"
  rc=0
  cargo +nightly fuzz run --dev "$t" "$work/$t" "corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    >"$work/$t.log" 2>&1 || rc=$?
  grep -E "^stat::number_of_executed_units" "$work/$t.log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$work/$t.log" >&2
    echo "fuzz: $t failed (exit $rc); its input is under fuzz/artifacts/$t" >&2
    exit 1
  fi
done
echo "fuzz: every target ran ${SECONDS_PER_TARGET} s without a crash ($(( $(date +%s) - start )) s in all)"
