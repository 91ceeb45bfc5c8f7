#!/usr/bin/env bash
# The goals table: each goal beside the figure measured in this run, and whether it is met. bench/run.sh
# calls it last (with its directory of raw outputs) and puts the table into bench/RESULTS.md; it also runs
# alone against a binary, measuring then what run.sh would have given it.
#
#   bench/goals.sh                      # alone: B=target/release/trigger-bridge DURATION=10 CONN=32
#   bench/goals.sh RAW_DIR              # reuse run.sh's outputs in RAW_DIR (what run.sh does)
#
# Reused from RAW_DIR when there (else measured here): storage.out (`bench storage`), s1_peak.out/.cpu
# (pure ingest, closed loop, and the server's CPU ms), s2_e2e_half.out (`bench e2e --rate <half of peak>`),
# backends.raw (bench/backends.sh RAW= lines for pg1 and pg3; its stderr in backends.err). A file that exists
# is used as it is, even empty: its figures are then "-" with the reason from the .err file. Always measured here: bench/wrk/run.sh on
# SQLite at 64, 16 and 1 connections and on PostgreSQL at 64 and 1 (WRK_COUNT events, WRK_COUNT_C1 at one
# connection), bench/sessions_disk.py on both stores (SESSIONS sessions) and bench/sweep.sh on both.
#
# Writes the markdown section to stdout, progress to stderr. A figure that cannot be measured is "-" with
# the reason in a numbered note; no single failure stops the others. Uses 127.0.0.1:18181, 18091, 18187.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-target/release/trigger-bridge}
DURATION=${DURATION:-10}
CONN=${CONN:-32}
WRK_COUNT=${WRK_COUNT:-20000}
WRK_COUNT_C1=${WRK_COUNT_C1:-2000}
SESSIONS=${SESSIONS:-1000}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432/test}
export PGURL
export STANDARD_WEBHOOK_SECRET=${STANDARD_WEBHOOK_SECRET:-whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
[ -x "$B" ] || { echo "build first: cargo build --release" >&2; exit 1; }
raw=${1:-}
work=$(mktemp -d)
[ -n "$raw" ] || raw=$work
server_pid=
stop_server() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi; server_pid=; }
trap 'stop_server; rm -rf "$work"' EXIT
have_pg() { command -v psql >/dev/null && psql -qAt "$PGURL" -c 'SELECT 1' >/dev/null 2>&1; }
# The last line of a file, for a note (empty when there is none).
why() { [ -s "$1" ] && tail -n1 "$1" | cut -c1-200; }

# ---- what run.sh measures, when it is not given -------------------------------------------------------
if [ ! -e "$raw/storage.out" ]; then
  echo "== goals: storage baseline" >&2
  "$B" bench storage --duration "$DURATION" --connections "$CONN" --data-dir "$work" >"$raw/storage.out" 2>"$raw/storage.err"
fi
if [ ! -e "$raw/s1_peak.out" ] || [ ! -e "$raw/s2_e2e_half.out" ]; then
  echo "== goals: pure ingest peak and e2e at half of it (own server)" >&2
  S=http://127.0.0.1:18181
  RUST_LOG=warn "$B" serve --config bench/bench.toml --data-dir "$work/data" >"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do curl -fs "$S/health" >/dev/null 2>&1 && break; sleep 0.1; done
  if curl -fs "$S/health" >/dev/null 2>&1; then
    cpu_ms() { awk -v t="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / t)}' "/proc/$server_pid/stat"; }
    L=(--server "$S" --duration "$DURATION" --connections "$CONN")
    c0=$(cpu_ms)
    "$B" bench ingest "${L[@]}" --subscription unbound >"$raw/s1_peak.out" 2>"$raw/s1_peak.err"
    echo $(($(cpu_ms) - c0)) >"$raw/s1_peak.cpu"
    half=$(grep -oE '^ingest: [0-9]+' "$raw/s1_peak.out" | tail -n1 | awk '{print int($NF / 2)}')
    [ "${half:-0}" -gt 0 ] && "$B" bench e2e "${L[@]}" --subscription standard --rate "$half" >"$raw/s2_e2e_half.out" 2>"$raw/s2_e2e_half.err"
  else
    echo "server did not start: $(why "$work/server.log")" >"$raw/s1_peak.err"
  fi
  stop_server
fi
if [ ! -e "$raw/backends.raw" ]; then
  if have_pg && command -v pgbench >/dev/null; then
    echo "== goals: bench/backends.sh pg1 pg3" >&2
    BACKENDS="pg1 pg3" RAW="$raw/backends.raw" DURATION=$DURATION CONN=$CONN B=$B bench/backends.sh >"$work/backends.md" 2>"$raw/backends.err" || true
  else
    echo "PostgreSQL at PGURL not reachable with psql, or pgbench missing" >"$raw/backends.err"
  fi
fi

# ---- measured here ------------------------------------------------------------------------------------
wrk_run() { # NAME STORE CONN THREADS COUNT
  local name=$1
  echo "== goals: bench/wrk/run.sh STORE=$2 CONN=$3 COUNT=$5" >&2
  if [ "$2" = postgres ] && ! have_pg; then echo "PostgreSQL at PGURL not reachable with psql" >"$raw/$name.err"; return; fi
  STORE=$2 CONN=$3 THREADS=$4 COUNT=$5 bench/wrk/run.sh "$B" >"$raw/$name.out" 2>"$raw/$name.err"
  echo "$?" >"$raw/$name.rc"
  echo "   $(grep -h '^end to end\|^postgres:' "$raw/$name.out" | tr '\n' ' ')" >&2
}
wrk_run wrk_sqlite_c64 sqlite 64 2 "$WRK_COUNT"
wrk_run wrk_sqlite_c16 sqlite 16 2 "$WRK_COUNT"
wrk_run wrk_sqlite_c1 sqlite 1 1 "$WRK_COUNT_C1"
wrk_run wrk_pg_c64 postgres 64 2 "$WRK_COUNT"
wrk_run wrk_pg_c1 postgres 1 1 "$WRK_COUNT_C1"
echo "== goals: bench/sessions_disk.py --count $SESSIONS (SQLite, PostgreSQL)" >&2
python3 bench/sessions_disk.py --bin "$B" --count "$SESSIONS" >"$raw/sessions_sqlite.out" 2>"$raw/sessions_sqlite.err"
if have_pg; then
  python3 bench/sessions_disk.py --bin "$B" --count "$SESSIONS" --postgres >"$raw/sessions_pg.out" 2>"$raw/sessions_pg.err"
else
  echo "PostgreSQL at PGURL not reachable with psql" >"$raw/sessions_pg.err"
fi

# ---- the table ----------------------------------------------------------------------------------------
notes=$work/notes
: >"$notes"
# note REASON: keeps REASON as note n (the same reason keeps its number) and prints "[n]"; fail REASON prints "- [n]".
note() {
  local n; n=$(grep -nxF -- "$1" "$notes" | head -n1 | cut -d: -f1)
  [ -n "$n" ] || { echo "$1" >>"$notes"; n=$(wc -l <"$notes"); }
  echo "[$n]"
}
fail() { echo "- $(note "$1")"; }
# met VALUE OP GOAL (OP: le, lt, ge): yes / **no**, or - when VALUE is not a number.
met() {
  awk -v v="$1" -v op="$2" -v g="$3" 'BEGIN {
    if (v !~ /^[0-9.]+$/) { print "-"; exit }
    ok = (op == "le" ? v + 0 <= g + 0 : op == "lt" ? v + 0 < g + 0 : v + 0 >= g + 0)
    print (ok ? "yes" : "**no**") }'
}
num() { [[ ${1:-} =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
# wrk_field NAME REGEX: the number after REGEX in bench/wrk/run.sh's output NAME (empty when absent).
wrk_field() { grep -oE "$2 [0-9.]+" "$raw/$1.out" 2>/dev/null | head -n1 | awk '{print $NF}'; }
# wrk_fail NAME: the reason a wrk run gave no figure.
wrk_fail() {
  local rc; rc=$(cat "$raw/$1.rc" 2>/dev/null)
  fail "bench/wrk/run.sh ($1) ${rc:+exited $rc: }$(why "$raw/$1.err")"
}
# wrk_warn NAME: a note when a wrk run that gave a figure still exited non-zero (events never delivered).
wrk_warn() {
  local rc; rc=$(cat "$raw/$1.rc" 2>/dev/null)
  if [ -n "$rc" ] && [ "$rc" != 0 ]; then echo " $(note "bench/wrk/run.sh ($1) exited $rc: $(why "$raw/$1.err")")"; fi
}
backend() { awk -v b="$1" -v k="$2" '$1 == b && $2 == k {print $3}' "$raw/backends.raw" 2>/dev/null | tail -n1; }
backends_fail() { fail "bench/backends.sh gave no $1: $(why "$raw/backends.err")"; }

rows=()
row() { rows+=("| $1 | $2 | $3 | $4 | $5 |"); }

# 1 and 5: SQLite through wrk at 64 connections.
e64=$(wrk_field wrk_sqlite_c64 'end to end:')
if num "$e64"; then
  row 1 "SQLite end to end, wrk at 64 connections (events/s delivered)" \
    "$e64/s = $(awk -v a="$e64" 'BEGIN {printf "%.1f", a / 755}') x the Svix reference (755/s at c64) [s]$(wrk_warn wrk_sqlite_c64)" ">= 9 000/s" "$(met "$e64" ge 9000)"
else
  row 1 "SQLite end to end, wrk at 64 connections (events/s delivered)" "$(wrk_fail wrk_sqlite_c64)" ">= 9 000/s" "-"
fi
# 2 and 3: PostgreSQL through wrk.
p64=$(wrk_field wrk_pg_c64 'end to end:')
if num "$p64"; then
  row 2 "PostgreSQL end to end, 1 replica, wrk at 64 connections (events/s)" "$p64/s$(wrk_warn wrk_pg_c64)" ">= 4 500/s" "$(met "$p64" ge 4500)"
else
  row 2 "PostgreSQL end to end, 1 replica, wrk at 64 connections (events/s)" "$(wrk_fail wrk_pg_c64)" ">= 4 500/s" "-"
fi
p1all=$(wrk_field wrk_pg_c1 'server \+ PostgreSQL')
if num "$p1all"; then
  p1ms=$(awk -v a="$p1all" 'BEGIN {printf "%.2f", a / 1000}')
  row 3 "PostgreSQL CPU per event at one connection (wrk CONN=1 THREADS=1), trigger-bridge + every PostgreSQL process" \
    "$p1ms ms (trigger-bridge $(wrk_field wrk_pg_c1 'server CPU') µs + PostgreSQL $(wrk_field wrk_pg_c1 'PostgreSQL CPU') µs; $(wrk_field wrk_pg_c1 'end to end:') events/s)$(wrk_warn wrk_pg_c1)" \
    "<= 1 ms" "$(met "$p1ms" le 1)"
else
  row 3 "PostgreSQL CPU per event at one connection (wrk CONN=1 THREADS=1), trigger-bridge + every PostgreSQL process" "$(wrk_fail wrk_pg_c1)" "<= 1 ms" "-"
fi
# 4: s1_peak of run.sh, server CPU / accepted receipts.
acc=$(grep -oE 'accepted [0-9]+' "$raw/s1_peak.out" 2>/dev/null | tail -n1 | awk '{print $2}')
cpu=$(cat "$raw/s1_peak.cpu" 2>/dev/null)
if num "$acc" && num "$cpu" && [ "$acc" -gt 0 ]; then
  us=$(awk -v c="$cpu" -v a="$acc" 'BEGIN {printf "%.0f", c * 1000 / a}')
  row 4 "SQLite server CPU per new receipt, pure ingest (\`bench ingest --subscription unbound\`, closed loop, $CONN connections)" "$us µs ($acc receipts, $cpu ms)" "<= 30 µs" "$(met "$us" le 30)"
else
  row 4 "SQLite server CPU per new receipt, pure ingest" "$(fail "no accepted count or server CPU from the s1_peak run: $(why "$raw/s1_peak.err")")" "<= 30 µs" "-"
fi
s64=$(wrk_field wrk_sqlite_c64 'server CPU')
if num "$s64"; then
  row 5 "SQLite server CPU per event end to end (wrk at 64 connections: server CPU / delivered)" "$s64 µs" "<= 100 µs" "$(met "$s64" le 100)"
else
  row 5 "SQLite server CPU per event end to end (wrk at 64 connections)" "$(wrk_fail wrk_sqlite_c64)" "<= 100 µs" "-"
fi
# 6, 7, 8: backends.sh pg1 end to end (bench outbound, $CONN connections).
v=$(backend pg1 e2e_rows)
if num "$v"; then row 6 "PostgreSQL rows written per event, ingest -> run delivered (backends.sh pg1 e2e)" "$v" "<= 5" "$(met "$v" le 5)"
else row 6 "PostgreSQL rows written per event, ingest -> run delivered" "$(backends_fail 'pg1 rows per event')" "<= 5" "-"; fi
v=$(backend pg1 e2e_bytes)
if num "$v"; then row 7 "PostgreSQL WAL bytes per event (backends.sh pg1 e2e)" "$v B" "<= 2 500 B" "$(met "$v" le 2500)"
else row 7 "PostgreSQL WAL bytes per event" "$(backends_fail 'pg1 WAL bytes per event')" "<= 2 500 B" "-"; fi
b1=$(backend pg1 e2e_bridge_cpu_us)
if num "$b1"; then row 8 "PostgreSQL, 1 replica: trigger-bridge CPU per event, bridge only (backends.sh pg1 e2e)" "$b1 µs (with PostgreSQL: $(backend pg1 e2e_cpu_us) µs)" "<= 100 µs" "$(met "$b1" le 100)"
else row 8 "PostgreSQL, 1 replica: trigger-bridge CPU per event, bridge only" "$(backends_fail 'pg1 bridge CPU per event')" "<= 100 µs" "-"; fi
b3=$(backend pg3 e2e_bridge_cpu_us)
if num "$b1" && num "$b3" && [ "$b1" != 0 ]; then
  r=$(awk -v a="$b3" -v b="$b1" 'BEGIN {printf "%.2f", a / b}')
  row 9 "3 replicas / 1 replica, trigger-bridge CPU per event (backends.sh pg3 / pg1 e2e, bridge only)" "${r}x ($b3 / $b1 µs)" "<= 1.3x" "$(met "$r" le 1.3)"
else
  row 9 "3 replicas / 1 replica, trigger-bridge CPU per event" "$(backends_fail 'pg3 and pg1 bridge CPU per event')" "<= 1.3x" "-"
fi
# 10: idle session on disk.
for st in sqlite pg; do
  label=SQLite; [ $st = pg ] && label=PostgreSQL
  v=$(grep -oE '[0-9]+ bytes per session' "$raw/sessions_$st.out" 2>/dev/null | awk '{print $1}')
  if num "$v"; then row 10 "Idle session on disk, $label (\`bench/sessions_disk.py$([ $st = pg ] && echo ' --postgres') --count $SESSIONS\`)" "$v B" "<= 1 KB (1 024 B)" "$(met "$v" le 1024)"
  else row 10 "Idle session on disk, $label" "$(fail "bench/sessions_disk.py ($label): $(why "$raw/sessions_$st.err")")" "<= 1 KB (1 024 B)" "-"; fi
done
# 11: PostgreSQL memory of one replica's pool.
ma=$(backend pg1 pool_pss_anon_kib); mn=$(backend pg1 pool_backends)
if num "$ma" && num "$mn" && [ "$mn" -gt 0 ]; then
  mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
  v=$(mib "$ma")
  row 11 "PostgreSQL server memory held by one replica's pool, right after the pg1 end-to-end run: Pss_Anon of /proc/PID/smaps_rollup summed over the backends whose application_name is the replica's (the backends' own memory; Private_Clean + Private_Dirty would also count shared_buffers pages only that backend touched)" \
    "$v MiB over $mn backends (Private_Clean + Private_Dirty $(mib "$(backend pg1 pool_private_kib)") MiB; Pss with the shared_buffers share $(mib "$(backend pg1 pool_pss_kib)") MiB)" "<= 100 MiB" "$(met "$v" le 100)"
else
  row 11 "PostgreSQL server memory held by one replica's pool" "$(backends_fail 'pool memory (or no backend of the replica was found)')" "<= 100 MiB" "-"
fi
# 12: p99 request -> run.started at half of peak.
p99=$(grep -o 'run.started: .*' "$raw/s2_e2e_half.out" 2>/dev/null | grep -oE 'p99 [0-9.]+' | awk '{print $2}')
rate=$(grep -oE '^e2e ingest: [0-9]+' "$raw/s2_e2e_half.out" 2>/dev/null | awk '{print $NF}')
peak=$(grep -oE '^ingest: [0-9]+' "$raw/s1_peak.out" 2>/dev/null | tail -n1 | awk '{print $NF}')
if num "$p99"; then
  row 12 "p99 request -> run.started at half of peak (\`bench e2e --subscription standard --rate $((${peak:-0} / 2))\`, half of the pure-ingest peak ${peak:-?} req/s)" "$p99 ms (at ${rate:-?} req/s achieved)" "< 5 ms" "$(met "$p99" lt 5)"
else
  row 12 "p99 request -> run.started at half of peak" "$(fail "no p99 from \`bench e2e --rate <half of peak>\`: $(why "$raw/s2_e2e_half.err")")" "< 5 ms" "-"
fi
# 13: retention: one sweep's cost per body removed (bench/sweep.sh: a store of settled receipts, then
# `trigger-bridge sweep --body-retention-days 0` against an empty second pass).
echo "== goals: retention (bench/sweep.sh, SQLite and PostgreSQL)" >&2
sweep_sqlite=$(bench/sweep.sh "$B" 2>"$raw/sweep_sqlite.err" | grep '^sweep:')
if have_pg; then
  sweep_pg=$(STORE=postgres bench/sweep.sh "$B" 2>"$raw/sweep_pg.err" | grep '^sweep:')
  [ -n "$sweep_pg" ] || sweep_pg=$(fail "bench/sweep.sh (PostgreSQL): $(why "$raw/sweep_pg.err")")
else
  sweep_pg=$(fail "PostgreSQL unreachable at PGURL")
fi
if [ -n "$sweep_sqlite" ]; then
  row 13 "Retention: one retention pass (\`bench/sweep.sh\`: \`trigger-bridge sweep --body-retention-days 0\` over settled receipts, minus an empty pass), per body removed" \
    "SQLite: ${sweep_sqlite#sweep: }; PostgreSQL: ${sweep_pg#sweep: }" \
    "counted per event; on PostgreSQL no per-row deletes on hot tables" "**no**: counted, but the body is removed by one UPDATE per receipt on both backends (no partitions)"
else
  row 13 "Retention: one retention pass per body removed" "$(fail "bench/sweep.sh: $(why "$raw/sweep_sqlite.err")")" "counted per event" "-"
fi

sqlite_limit=$(grep -oE 'storage: [0-9]+' "$raw/storage.out" 2>/dev/null | awk '{print $2}')
pg_limit=$(backend pg1 limit)
echo "## Goals, this run"
echo
echo "Every figure below comes from one and the same run (\`bench/goals.sh\`, called by \`bench/run.sh\`). Storage limits measured in it:"
echo "SQLite \`bench storage\` ${sqlite_limit:-?} rows/s (1 KiB rows, fsync per group commit, $CONN writers);"
echo "PostgreSQL pgbench ${pg_limit:-?} inserts/s (one 1 KiB-row INSERT per transaction, $CONN clients)."
echo "The wrk runs (\`bench/wrk/run.sh\`) replay $WRK_COUNT pre-signed events ($WRK_COUNT_C1 at one connection) to the"
echo "\`outbound\` subscription and count what the receiver got; the load tool runs on the same cores."
echo
echo "| # | figure | this run | goal | met? |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
e16=$(wrk_field wrk_sqlite_c16 'end to end:'); e1=$(wrk_field wrk_sqlite_c1 'end to end:')
ratio() { if num "$1"; then awk -v a="$1" -v b="$2" 'BEGIN {printf "%s/s = %.1f x", a, a / b}'; else echo "-"; fi; }
echo "[s] Svix: 755 events/s at 64 connections, 855 at 16, 557 at 1: a reference run of Svix measured side by side"
echo "on this kind of machine on 2026-12-07, NOT this run. This run, SQLite through wrk: c64 $(ratio "$e64" 755),"
echo "c16 $(ratio "$e16" 855), c1 $(ratio "$e1" 557) the Svix figure at the same connections."
if [ -s "$notes" ]; then
  echo
  echo "Not measured:"
  echo
  n=0
  while IFS= read -r line; do n=$((n + 1)); echo "- [$n] $line"; done <"$notes"
fi
