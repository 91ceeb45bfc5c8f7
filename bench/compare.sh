#!/usr/bin/env bash
# Compares two builds of trigger-bridge on the same machine in one run, alternating A B A B ... so that
# drift of a noisy machine hits both alike. For each round and build: a fresh store, then
#   pure receipt ingest (`bench ingest --subscription unbound`) and ingest + noop run (`bench e2e`),
# each closed loop for DURATION seconds, recording req/s, the server's CPU and the bytes it wrote to
# storage (/proc/PID/io write_bytes) per answered request.
#
#   bench/compare.sh OLD_BINARY NEW_BINARY            # ROUNDS=3 DURATION=5 CONN=32 by default
#   CONFIG=my.toml bench/compare.sh OLD NEW           # a config both builds read (default bench/bench.toml)
#
# Prints one line per round and build, then the medians. Uses 127.0.0.1:18181 (bench/bench.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: bench/compare.sh OLD_BINARY NEW_BINARY}
B=${2:?usage: bench/compare.sh OLD_BINARY NEW_BINARY}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
CONN=${CONN:-32}
CONFIG=${CONFIG:-bench/bench.toml}
S=http://127.0.0.1:18181
export STANDARD_WEBHOOK_SECRET=${STANDARD_WEBHOOK_SECRET:-whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
work=$(mktemp -d)
pid=
stop() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; pid=; }
trap 'stop; rm -rf "$work"' EXIT
cpu_ms() { awk -v t="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / t)}' "/proc/$pid/stat"; }
# Bytes the server caused to be written to storage (the kernel's count: WAL, checkpoints, fsync'd pages).
wbytes() { awk '/^write_bytes:/ {print $2}' "/proc/$pid/io"; }
# one BIN SCENARIO ARGS...: prints "req/s cpu_us_per_req bytes_written_per_req"
one() {
  local bin=$1; shift
  local before after out wb0 wb1
  before=$(cpu_ms)
  wb0=$(wbytes)
  out=$("$bin" bench "$@" --server "$S" --duration "$DURATION" --connections "$CONN" 2>/dev/null | grep -m1 'req/s')
  after=$(cpu_ms)
  wb1=$(wbytes)
  local rate; rate=$(echo "$out" | grep -o '[0-9]* req/s' | awk '{print $1}')
  awk -v r="$rate" -v c="$((after - before))" -v w="$((wb1 - wb0))" -v d="$DURATION" \
    'BEGIN { printf "%d %.0f %.0f", r, (r > 0 ? c * 1000 / (r * d) : 0), (r > 0 ? w / (r * d) : 0) }'
}
printf '%-5s %-6s %11s %14s %13s %9s %12s %10s\n' round build ingest_rps ingest_cpu_us ingest_bytes e2e_rps e2e_cpu_us e2e_bytes
for r in $(seq "$ROUNDS"); do
  for label in A B; do
    bin=$A; [ "$label" = B ] && bin=$B
    rm -rf "$work/data"
    RUST_LOG=warn "$bin" serve --config "$CONFIG" --data-dir "$work/data" >"$work/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -fs "$S/health" >/dev/null 2>&1 && break; sleep 0.1; done
    read -r ir ic iw <<<"$(one "$bin" ingest --subscription unbound)"
    read -r er ec ew <<<"$(one "$bin" e2e --subscription standard)"
    stop
    printf '%-5s %-6s %11s %14s %13s %9s %12s %10s\n' "$r" "$label" "$ir" "$ic" "$iw" "$er" "$ec" "$ew" | tee -a "$work/rows"
  done
done
median() { awk -v l="$1" -v c="$2" '$2 == l {print $c}' "$work/rows" | sort -n | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}'; }
echo "medians (A = $A, B = $B):"
for label in A B; do
  echo "  $label: ingest $(median "$label" 3) req/s, $(median "$label" 4) us CPU/req, $(median "$label" 5) B written/req; e2e $(median "$label" 6) req/s, $(median "$label" 7) us CPU/req, $(median "$label" 8) B written/req"
done
