#!/usr/bin/env bash
# The console's browser tests (issue #13) in headless Debian Chromium, driven by playwright-core.
# Needs: target/debug/trigger-bridge (cargo build, or cargo test --workspace), Node.js 18+ with npm,
# and /usr/bin/chromium (apt-get install chromium). Screenshots: target/browser-screenshots/.
# DOC_SCREENSHOTS=docs/images tests/browser/run.sh also refreshes the committed pictures.
set -euo pipefail
cd "$(dirname "$0")"
[ -x ../../target/debug/trigger-bridge ] || { echo "build the binary first: cargo build -p trigger-bridge" >&2; exit 1; }
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "Chromium not found: apt-get install chromium" >&2; exit 1; }
[ -d node_modules/playwright-core ] || npm ci --no-audit --no-fund --loglevel=error
node --test --test-concurrency=1 console.test.mjs
