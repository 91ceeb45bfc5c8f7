#!/usr/bin/env bash
# SQLite, PostgreSQL with one replica and PostgreSQL with three replicas, side by side in one run
# (issue #10). For each: the storage limit (SQLite: `bench storage`, 1 KiB rows, fsync per group commit;
# PostgreSQL: pgbench inserting 1 KiB rows, one transaction each), pure receipt ingest, end to end
# (signed ingest -> `http` run delivered to the receiver of `bench outbound`), and a drain of queued
# deliveries. Per event: transactions and rows written, bytes written to storage (SQLite: the server's
# /proc write_bytes; PostgreSQL: WAL bytes) and the CPU of the server processes AND of PostgreSQL; end to end
# also the CPU of the trigger-bridge processes alone, and (PostgreSQL, one replica) the private memory of the
# PostgreSQL backends serving that replica's pool, read right after its end-to-end run.
#
#   cargo build --release && bench/backends.sh            # DURATION=10 CONN=32 by default
#
# Writes the table to stdout (markdown) and progress to stderr. PostgreSQL: PGURL (default
# postgres://postgres@127.0.0.1:5432/test); each backend run uses a fresh schema, dropped afterwards, and
# connects with `application_name` = that schema's name (how its backends are found in pg_stat_activity).
# With RAW=FILE, also appends `BACKEND KEY VALUE` lines to FILE (bench/goals.sh reads them).
# Uses ports 18181-18183 and 18091 (the receiver).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-target/release/trigger-bridge}
DURATION=${DURATION:-10}
CONN=${CONN:-32}
DRAIN=${DRAIN_COUNT:-20000}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432/test}
BACKENDS=${BACKENDS:-"sqlite pg1 pg3"}
RAW=${RAW:-}
export STANDARD_WEBHOOK_SECRET=${STANDARD_WEBHOOK_SECRET:-whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
[ -x "$B" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v psql >/dev/null || { echo "psql is needed (apt-get install postgresql-client)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
schema=
stop_all() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  pids=()
}
drop_schema() { [ -n "$schema" ] && psql -q "$PGURL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true; schema=; }
trap 'stop_all; drop_schema; rm -rf "$work"' EXIT

sql() { psql -qAt "$PGURL" -c "$1"; }
# CPU (ms) of a list of pids, and of every PostgreSQL process.
cpu_of() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk -v k="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / k)}' "/proc/$p/stat"))); done; echo $t; }
pg_cpu() { cpu_of $(pgrep -x postgres || pgrep postgres || true); }
wbytes_of() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/io" ] && t=$((t + $(awk '/^write_bytes:/ {print $2}' "/proc/$p/io"))); done; echo $t; }
# Prometheus counter summed over replicas: metric NAME from every server.
metric() { local t=0 port v; for port in $ports; do v=$(curl -fs "http://127.0.0.1:$port/metrics" | awk -v m="$1" 'index($0, m) == 1 {s += $NF} END {print s + 0}'); t=$(awk -v a="$t" -v b="$v" 'BEGIN {print a + b}'); done; echo "$t"; }
# PostgreSQL counters of the database: commits, rows written, WAL bytes.
pg_counts() { sql "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint FROM pg_stat_database WHERE datname = current_database()" | tr '|' ' '; }

start_servers() { # BACKEND
  local backend=$1 n=1 i
  ports=
  local url=
  case $backend in
    sqlite) ;;
    pg1) n=1 ;;
    pg3) n=3 ;;
  esac
  if [ "$backend" != sqlite ]; then
    schema="tb_bench_$$_$backend"
    sql "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema" >/dev/null
    url="$PGURL?options=-c%20search_path%3D$schema&application_name=$schema"
    case $PGURL in *\?*) url="$PGURL&options=-c%20search_path%3D$schema&application_name=$schema" ;; esac
  fi
  for i in $(seq "$n"); do
    local port=$((18180 + i))
    ports="$ports $port"
    local args=(serve --config bench/bench.toml --listen "127.0.0.1:$port" --data-dir "$work/data-$backend-$i")
    [ -n "$url" ] && args+=(--database-url "$url" --replica-id "bench$i")
    RUST_LOG=warn "$B" "${args[@]}" >"$work/server-$backend-$i.log" 2>&1 &
    pids+=($!)
    local ok=
    for _ in $(seq 200); do curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && ok=1 && break; sleep 0.1; done
    [ -n "$ok" ] || { echo "server $backend/$i did not start; see $work/server-$backend-$i.log" >&2; cat "$work/server-$backend-$i.log" >&2; exit 1; }
  done
  servers=$(for p in $ports; do printf 'http://127.0.0.1:%s,' "$p"; done | sed 's/,$//')
  dburl=$url
}

storage_limit() { # BACKEND -> rows/s
  if [ "$1" = sqlite ]; then
    "$B" bench storage --duration "$DURATION" --connections "$CONN" --data-dir "$work" 2>/dev/null | grep -o 'storage: [0-9]*' | awk '{print $2}'
  else
    sql "DROP TABLE IF EXISTS tb_bench_rows; CREATE TABLE tb_bench_rows (k bigserial PRIMARY KEY, v bytea NOT NULL)" >/dev/null
    echo "INSERT INTO tb_bench_rows (v) VALUES (decode(repeat('78', 1024), 'hex'));" >"$work/insert.sql"
    pgbench -n -c "$CONN" -j 2 -T "$DURATION" -f "$work/insert.sql" "$PGURL" 2>/dev/null | awk '/^tps/ {printf "%d", $3}'
    sql "DROP TABLE tb_bench_rows" >/dev/null
  fi
}

# measure BACKEND NAME CMD...: runs a bench command against the servers and prints
# "rate cpu_us_per_event tx_per_event jobs_per_event rows_per_event bytes_per_event bridge_cpu_us_per_event"
# (rows: PostgreSQL only; cpu: trigger-bridge + PostgreSQL, bridge_cpu: the trigger-bridge processes alone)
measure() {
  local backend=$1 name=$2; shift 2
  local c0 c1 p0=0 p1=0 t0 t1 j0 j1 w0 w1 x0=0 x1=0 r0=0 r1=0 l0=0 l1=0 out rate events
  c0=$(cpu_of "${pids[@]}"); t0=$(metric tb_store_transactions_total); j0=$(metric tb_store_write_jobs_total)
  w0=$(wbytes_of "${pids[@]}")
  if [ "$backend" != sqlite ]; then p0=$(pg_cpu); read -r x0 r0 l0 <<<"$(pg_counts)"; fi
  out=$("$@" 2>"$work/$backend-$name.err" | tail -n1)
  echo "$out" >"$work/$backend-$name.out"
  sleep 1 # PostgreSQL publishes its statistics about once a second
  c1=$(cpu_of "${pids[@]}"); t1=$(metric tb_store_transactions_total); j1=$(metric tb_store_write_jobs_total)
  w1=$(wbytes_of "${pids[@]}")
  if [ "$backend" != sqlite ]; then p1=$(pg_cpu); read -r x1 r1 l1 <<<"$(pg_counts)"; fi
  rate=$(echo "$out" | grep -oE '[0-9]+ (req|deliveries)/s' | head -n1 | awk '{print $1}')
  events=$(echo "$out" | grep -oE '(accepted|of) [0-9]+' | head -n1 | awk '{print $2}')
  [ -z "$events" ] && events=$(echo "$out" | grep -oE '[0-9]+ of [0-9]+ runs' | awk '{print $1}')
  [ -z "$events" ] && events=1
  local bytes=$((w1 - w0)); [ "$backend" != sqlite ] && bytes=$((l1 - l0))
  local tx=$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}'); [ "$backend" != sqlite ] && tx=$((x1 - x0))
  awk -v r="${rate:-0}" -v e="$events" -v c="$((c1 - c0 + p1 - p0))" -v t="$tx" -v j="$(awk -v a="$j0" -v b="$j1" 'BEGIN {print b - a}')" \
      -v rows="$((r1 - r0))" -v b="$bytes" -v sq="$backend" -v bc="$((c1 - c0))" \
    'BEGIN { printf "%d %.0f %.2f %.2f %s %.0f %.0f", r, c * 1000 / e, t / e, j / e, (sq == "sqlite" ? "-" : sprintf("%.1f", rows / e)), b / e, bc * 1000 / e }'
}

# Memory of the PostgreSQL backends whose application_name is the running schema (the servers' pool), from
# /proc/PID/smaps_rollup, summed, in KiB: Pss_Anon (the backends' own memory: caches, sort and hash areas),
# Private_Clean + Private_Dirty (also counts shared_buffers pages no other process has touched) and Pss
# (with a share of shared_buffers); prints "pss_anon_kib private_kib pss_kib backends".
pool_memory() {
  local p a b c d anon=0 priv=0 pss=0 n=0 backends
  backends=$(sql "SELECT pid FROM pg_stat_activity WHERE application_name = '$schema'")
  for p in $backends; do
    [ -r "/proc/$p/smaps_rollup" ] || continue
    read -r a b c d <<<"$(awk '/^Private_Clean:/ {pc = $2} /^Private_Dirty:/ {pd = $2} /^Pss:/ {ps = $2} /^Pss_Anon:/ {pa = $2}
      END {print pc + 0, pd + 0, ps + 0, pa + 0}' "/proc/$p/smaps_rollup")"
    priv=$((priv + a + b)); pss=$((pss + c)); anon=$((anon + d)); n=$((n + 1))
  done
  echo "$anon $priv $pss $n"
}
raw() { if [ -n "$RAW" ]; then echo "$*" >>"$RAW"; fi; }

rows=()
for backend in $BACKENDS; do
  echo "== $backend: storage limit" >&2
  limit=$(storage_limit "$backend")
  echo "   $limit rows/s" >&2
  start_servers "$backend"
  L=(--server "$servers" --duration "$DURATION" --connections "$CONN")
  echo "== $backend: ingest" >&2
  read -r ir ic it ij iw ib ibc <<<"$(measure "$backend" ingest "$B" bench ingest "${L[@]}" --subscription unbound)"
  echo "   $ir req/s, $ic us CPU/event, $it tx/event, $iw rows/event, $ib B/event" >&2
  echo "== $backend: end to end (http delivered)" >&2
  read -r er ec et ej ew eb ebc <<<"$(measure "$backend" e2e "$B" bench outbound "${L[@]}" --subscription outbound)"
  echo "   $er deliveries/s, $ec us CPU/event ($ebc us trigger-bridge alone), $et tx/event, $ew rows/event, $eb B/event" >&2
  raw "$backend limit ${limit:--}"
  raw "$backend e2e_rate $er"
  raw "$backend e2e_cpu_us $ec"
  raw "$backend e2e_bridge_cpu_us $ebc"
  raw "$backend e2e_rows $ew"
  raw "$backend e2e_bytes $eb"
  raw "$backend e2e_events $(grep -oE '[0-9]+ of [0-9]+ runs' "$work/$backend-e2e.out" | awk '{print $1}')"
  if [ "$backend" = pg1 ]; then
    read -r ma mp ms mn <<<"$(pool_memory)"
    echo "   PostgreSQL backends of the pool: $mn, Pss_Anon $ma KiB, private $mp KiB, Pss $ms KiB" >&2
    raw "$backend pool_pss_anon_kib $ma"
    raw "$backend pool_private_kib $mp"
    raw "$backend pool_pss_kib $ms"
    raw "$backend pool_backends $mn"
  fi
  stop_all
  drain=-
  if [ "$backend" != pg3 ]; then
    echo "== $backend: drain $DRAIN" >&2
    # --connections: queueing from one address at the server's per-client connection share (64) is refused.
    dargs=(bench drain --config bench/bench.toml --count "$DRAIN" --connections "$CONN" --data-dir "$work/drain-$backend")
    [ "$backend" = pg1 ] && dargs+=(--database-url "$dburl")
    drain=$("$B" "${dargs[@]}" 2>"$work/drain-$backend.err" | grep -oE '= [0-9]+ deliveries/s' | awk '{print $2}' || echo -)
    if [ "$drain" = - ]; then
      echo "   bench drain failed: $(grep -v ' WARN ' "$work/drain-$backend.err" | tail -n1)" >&2
      # A failed drain can leave the server it started running (it would hold the port for the next one).
      for p in $(pgrep -f -- "--data-dir $work/drain-$backend" || true); do kill "$p" 2>/dev/null || true; done
    fi
    echo "   $drain deliveries/s" >&2
  fi
  drop_schema
  rows+=("| $backend | $limit | $ir | $ic | $it | $iw | $ib | $er | $ec | $ebc | $et | $ew | $eb | ${drain:--} |")
done

echo "| backend | storage limit (rows/s) | ingest (req/s) | ingest CPU/event (µs) | ingest tx/event | ingest rows/event | ingest bytes/event | e2e delivered/s | e2e CPU/event (µs) | e2e bridge-only CPU/event (µs) | e2e tx/event | e2e rows/event | e2e bytes/event | drain (deliveries/s) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
