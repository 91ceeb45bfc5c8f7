#!/usr/bin/env bash
# Runs every benchmark scenario of issue #3 on this machine, then SQLite and PostgreSQL (one and three
# replicas) side by side (bench/backends.sh, issue #10), then the goals table of this run (bench/goals.sh:
# wrk end to end on both stores, idle session bytes, PostgreSQL pool memory) and writes bench/RESULTS.md.
#
#   cargo build --release && bench/run.sh            # DURATION=10 by default (seconds per scenario)
#
# Starts its own server (bench/bench.toml) on 127.0.0.1:18181 with a fresh store in $DATA (default
# ./data/bench), so nothing else should use that port. The load generator runs on the same machine.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-target/release/trigger-bridge}
DURATION=${DURATION:-10}
CONN=${CONN:-32}
DATA=${DATA:-./data/bench}
S=http://127.0.0.1:18181
export STANDARD_WEBHOOK_SECRET=${STANDARD_WEBHOOK_SECRET:-whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
[ -x "$B" ] || { echo "build first: cargo build --release" >&2; exit 1; }
out=$(mktemp -d)
server_pid=

start_server() {
  rm -rf "$DATA"
  RUST_LOG=warn "$B" serve --config bench/bench.toml --data-dir "$DATA" >"$out/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do curl -fs "$S/health" >/dev/null 2>&1 && return; sleep 0.1; done
  echo "server did not start; see $out/server.log" >&2; exit 1
}
stop_server() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true; server_pid=; }
trap stop_server EXIT
cpu_ms() { awk -v t="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / t)}' "/proc/$server_pid/stat"; }
# run NAME CMD...: runs a bench command, keeps its last line, and the server CPU it cost (a command that
# fails leaves its reason as the last line instead: one scenario never stops the others)
run() {
  local name=$1; shift
  local before after rc=0
  before=$(cpu_ms)
  "$@" >"$out/$name.out" 2>"$out/$name.err" || rc=$?
  [ "$rc" = 0 ] || echo "(failed, exit $rc: $(tail -n1 "$out/$name.err"))" >>"$out/$name.out"
  after=$(cpu_ms)
  echo "$((after - before))" >"$out/$name.cpu"
  echo "== $name: $(tail -n1 "$out/$name.out")  [server cpu $((after - before)) ms]" >&2
}
field() { grep -o "$2 [0-9.]*" "$out/$1.out" | tail -n1 | awk '{print $2}'; }
rate() { tail -n1 "$out/$1.out" | grep -o '^[^:]*: [0-9]*' | awk '{print $NF}'; }

echo "== storage baseline" >&2
"$B" bench storage --duration "$DURATION" --connections "$CONN" --data-dir "$(dirname "$DATA")" >"$out/storage.out" 2>"$out/storage.err" ||
  echo "(bench storage failed: $(tail -n1 "$out/storage.err"))" >>"$out/storage.out"
baseline=$(grep -o 'storage: [0-9]*' "$out/storage.out" | awk '{print $2}' || true)
echo "== storage: $baseline rows/s" >&2

start_server
L=(--server "$S" --duration "$DURATION" --connections "$CONN")
[ -n "$baseline" ] && L+=(--baseline "$baseline")
run s1_peak "$B" bench ingest "${L[@]}" --subscription unbound
peak=$(rate s1_peak || true)
[[ $peak =~ ^[0-9]+$ ]] || peak=0
half=$((peak / 2))
run s1_half "$B" bench ingest "${L[@]}" --subscription unbound --rate "$half"
run s2_e2e_half "$B" bench e2e "${L[@]}" --subscription standard --rate "$half"
run s3_dup10 "$B" bench ingest "${L[@]}" --subscription unbound --duplicates 0.1
run s3_dup100 "$B" bench ingest "${L[@]}" --subscription unbound --duplicates 1.0
moderate=$((peak / 10))
run s2_e2e "$B" bench e2e "${L[@]}" --subscription standard --rate "$moderate"
run s2_e2e_peak "$B" bench e2e "${L[@]}" --subscription standard
run s4_outbound "$B" bench outbound "${L[@]}" --subscription outbound
run s4_outbound_fail50 "$B" bench outbound "${L[@]}" --subscription outbound --fail-rate 0.5
stop_server

echo "== drain" >&2
"$B" bench drain --config bench/bench.toml --count "${DRAIN_COUNT:-100000}" --connections "$CONN" --data-dir "$DATA-drain" >"$out/s5_drain.out" 2>"$out/s5_drain.err" ||
  echo "(bench drain failed: $(tail -n1 "$out/s5_drain.err"))" >>"$out/s5_drain.out"
echo "== $(tail -n1 "$out/s5_drain.out")" >&2

echo "== sources: schedules and a JetStream queue (issue #11)" >&2
"$B" bench schedules --count "${SCHEDULES:-10000}" --minutes 3 --data-dir "$DATA-sources" >"$out/s6_schedules.out" 2>"$out/s6_schedules.err" || echo "(bench schedules failed: see $out/s6_schedules.err)" >"$out/s6_schedules.out"
echo "== $(tail -n1 "$out/s6_schedules.out")" >&2
"$B" bench queue --messages "${QUEUE_MESSAGES:-20000}" --data-dir "$DATA-sources" >"$out/s7_queue.out" 2>"$out/s7_queue.err" || echo "(bench queue failed, is NATS with JetStream on 127.0.0.1:4222? see $out/s7_queue.err)" >"$out/s7_queue.out"
echo "== $(tail -n1 "$out/s7_queue.out")" >&2

echo "== workers over NATS: webhook -> nats executor -> service -> CompletionEvent -> run (issue #12)" >&2
"$B" bench services --events "${SERVICE_EVENTS:-5000}" --connections "$CONN" --data-dir "$DATA-sources" >"$out/s8_services.out" 2>"$out/s8_services.err" || echo "(bench services failed, is NATS with JetStream on 127.0.0.1:4222? see $out/s8_services.err)" >"$out/s8_services.out"
echo "== $(tail -n1 "$out/s8_services.out")" >&2
"$B" bench services --events 500 --connections 1 --data-dir "$DATA-sources" >"$out/s8_services_1.out" 2>"$out/s8_services_1.err" || echo "(bench services failed: see $out/s8_services_1.err)" >"$out/s8_services_1.out"

echo "== backends: SQLite, PostgreSQL x1, PostgreSQL x3 (bench/backends.sh)" >&2
: >"$out/backends.raw"
if command -v psql >/dev/null && command -v pgbench >/dev/null; then
  DURATION=$DURATION CONN=$CONN B=$B RAW="$out/backends.raw" bench/backends.sh >"$out/backends.md" 2>"$out/backends.err" || echo "(bench/backends.sh failed: see $out/backends.err)" >"$out/backends.md"
else
  echo "(skipped: psql and pgbench are needed for the PostgreSQL side)" | tee "$out/backends.err" >"$out/backends.md"
fi

echo "== goals of this run (bench/goals.sh)" >&2
B=$B DURATION=$DURATION CONN=$CONN bench/goals.sh "$out" >"$out/goals.md" || echo "(bench/goals.sh failed; raw outputs in $out)" >>"$out/goals.md"

cpu_per() { # µs of server CPU per answered request
  local n; n=$(grep -o '^[^:]*: [0-9]*' "$out/$1.out" | head -n1 | awk '{print $NF}')
  awk -v c="$(cat "$out/$1.cpu")" -v r="$n" -v d="$DURATION" 'BEGIN { if (r > 0) printf "%.0f", c * 1000 / (r * d); else print "-" }'
}

{
  echo "# Benchmark results"
  echo
  echo "Written by \`bench/run.sh\` on $(date -u +%Y-%m-%dT%H:%MZ) (commit $(git rev-parse --short HEAD))."
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(df -h "$(dirname "$DATA")" | awk 'NR==2{print $1}'); the load generator runs on the same cores as the server."
  echo "Settings: DURATION=${DURATION}s per scenario, $CONN connections, 1 KiB Standard Webhooks bodies, SQLite WAL, each group commit flushed (fdatasync) before its callers are answered."
  echo
  cat "$out/goals.md"
  echo
  echo "## Scenarios"
  echo
  echo "| scenario | command | result | server CPU / req |"
  echo "|---|---|---|---|"
  echo "| storage baseline (1 KiB rows, fsync per group commit) | \`bench storage --duration $DURATION --connections $CONN\` | $(tail -n1 "$out/storage.out") | |"
  echo "| 1. pure receipt ingest, closed loop (peak) | \`bench ingest --subscription unbound --connections $CONN\` | $(tail -n1 "$out/s1_peak.out") | $(cpu_per s1_peak) µs |"
  echo "| 1. pure receipt ingest at half of peak (open loop) | \`bench ingest --subscription unbound --rate $half\` | $(tail -n1 "$out/s1_half.out") | $(cpu_per s1_half) µs |"
  echo "| 2. ingest + noop run at half of the ingest peak (open loop) | \`bench e2e --subscription standard --rate $half\` | $(tail -n2 "$out/s2_e2e_half.out" | tr '\n' ' ') | $(cpu_per s2_e2e_half) µs |"
  echo "| 3. 10 % duplicates | \`bench ingest --subscription unbound --duplicates 0.1\` | $(tail -n1 "$out/s3_dup10.out") | $(cpu_per s3_dup10) µs |"
  echo "| 3. duplicates only | \`bench ingest --subscription unbound --duplicates 1.0\` | $(tail -n1 "$out/s3_dup100.out") | $(cpu_per s3_dup100) µs |"
  echo "| 2. ingest + noop run, moderate load (open loop) | \`bench e2e --subscription standard --rate $moderate\` | $(tail -n2 "$out/s2_e2e.out" | tr '\n' ' ') | $(cpu_per s2_e2e) µs |"
  echo "| 2. ingest + noop run, closed loop | \`bench e2e --subscription standard\` | $(tail -n2 "$out/s2_e2e_peak.out" | tr '\n' ' ') | $(cpu_per s2_e2e_peak) µs |"
  echo "| 4. outbound http executor, receiver always 200 | \`bench outbound --subscription outbound\` | $(tail -n1 "$out/s4_outbound.out") | |"
  echo "| 4. outbound, receiver fails 50 % | \`bench outbound --subscription outbound --fail-rate 0.5\` | $(tail -n1 "$out/s4_outbound_fail50.out") | |"
  echo "| 5. drain ${DRAIN_COUNT:-100000} pending noop deliveries | \`bench drain --count ${DRAIN_COUNT:-100000} --connections $CONN\` | $(tail -n1 "$out/s5_drain.out") | |"
  echo "| 6. ${SCHEDULES:-10000} schedules firing every minute (in process, simulated clock) | \`bench schedules --count ${SCHEDULES:-10000}\` | $(tail -n1 "$out/s6_schedules.out") | |"
  echo "| 7. JetStream messages to noop runs (in process) | \`bench queue --messages ${QUEUE_MESSAGES:-20000}\` | $(tail -n1 "$out/s7_queue.out") | |"
  echo "| 8. webhook -> nats executor -> service handler -> CompletionEvent -> run completed (in process, closed loop) | \`bench services --events ${SERVICE_EVENTS:-5000} --connections $CONN\` | $(tail -n1 "$out/s8_services.out") | |"
  echo "| 8. the same, one sender (unloaded latency) | \`bench services --events 500 --connections 1\` | $(tail -n1 "$out/s8_services_1.out") | |"
  echo
  echo "Ratios: pure receipt ingest = $(awk -v a="$peak" -v b="$baseline" 'BEGIN{printf "%.0f", 100*a/b}') % of the storage baseline; duplicates answered at $(awk -v a="$(rate s3_dup100)" -v b="$peak" 'BEGIN{printf "%.1f", a/b}') x the rate of new receipts."
  echo
  echo "## SQLite and PostgreSQL side by side (\`bench/backends.sh\`, same run)"
  echo
  echo "DURATION=${DURATION}s, $CONN connections. Storage limit: SQLite \`bench storage\` (1 KiB rows, fsync per group commit); PostgreSQL pgbench, one 1 KiB-row INSERT per transaction, $CONN clients. End to end = signed ingest -> \`http\` run delivered to the receiver of \`bench outbound\`. CPU per event counts the trigger-bridge processes AND every PostgreSQL process; the bridge-only column, the trigger-bridge processes alone. Transactions per event: SQLite group commits (\`tb_store_transactions_total\`), PostgreSQL all commits of the database (\`pg_stat_database.xact_commit\`, reads included). Rows per event: PostgreSQL rows inserted + updated + deleted. Bytes per event: SQLite bytes the server wrote to storage (\`/proc/PID/io\`), PostgreSQL WAL bytes."
  echo
  cat "$out/backends.md"
  if [ -f bench/analysis.md ]; then echo; cat bench/analysis.md; fi
} >bench/RESULTS.md
echo "wrote bench/RESULTS.md (raw outputs in $out)" >&2
