#!/usr/bin/env bash
# Retention's cost per event. Fills a fresh store with settled receipts (signed ingest -> noop run:
# `bench ingest --subscription standard` of bench/bench.toml for DURATION s), stops the server, waits for
# nothing else, then times `trigger-bridge sweep --body-retention-days 0` twice: the first pass removes
# the body of every settled receipt, the second finds none (the fixed cost of the process and of opening
# the store). The cost per event is their difference per body removed: CPU of the sweep process (and on
# PostgreSQL of every postgres process), and on PostgreSQL the WAL bytes the pass wrote.
#
#   bench/sweep.sh BINARY                     # SQLite; DURATION=5 CONN=32
#   STORE=postgres bench/sweep.sh BINARY      # PostgreSQL at PGURL, in a fresh schema dropped afterwards
#
# Prints one line: `sweep: N bodies removed, X us CPU per body (...)`. Uses 127.0.0.1:18181. Needs
# /usr/bin/time (Debian package `time`), python3 and, for STORE=postgres, psql on the database's host
# (the CPU of its processes is read from /proc). The receipts get 2 s to settle after the load; N counts
# those that did.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: bench/sweep.sh BINARY}
DURATION=${DURATION:-5}
CONN=${CONN:-32}
STORE=${STORE:-sqlite}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432/test}
export STANDARD_WEBHOOK_SECRET=${STANDARD_WEBHOOK_SECRET:-whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
[ -x /usr/bin/time ] || { echo "/usr/bin/time not found: apt-get install time" >&2; exit 2; }
S=http://127.0.0.1:18181
work=$(mktemp -d)
server=
schema=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  [ -n "$schema" ] && psql -q "$PGURL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
store=(--data-dir "$work/data")
if [ "$STORE" = postgres ]; then
  command -v psql >/dev/null || { echo "psql not found: apt-get install postgresql-client" >&2; exit 2; }
  schema="tb_sweep_$$"
  psql -q "$PGURL" -c "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema" >/dev/null
  sep='?'; case $PGURL in *\?*) sep='&' ;; esac
  store=(--database-url "$PGURL${sep}options=-c%20search_path%3D$schema&application_name=$schema")
fi
RUST_LOG=warn "$B" serve --config bench/bench.toml "${store[@]}" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 200); do curl -fs "$S/health" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fs "$S/health" >/dev/null || { tail -n 20 "$work/server.log" >&2; exit 1; }
"$B" bench ingest --server "$S" --subscription standard --duration "$DURATION" --connections "$CONN" \
  | grep -m1 'req/s' >&2
sleep 2 # the last noop runs settle their receipts
kill "$server"; wait "$server" 2>/dev/null || true; server=
# CPU ms of PostgreSQL now (0 on SQLite): every live postgres process's own time, plus the postmaster's
# reaped children (a backend that ended, like the sweep's own, moves its time there).
pg_cpu() {
  [ "$STORE" = postgres ] || { echo 0; return; }
  local p t=0 k pm; k=$(getconf CLK_TCK)
  pm=$(pgrep -o -x postgres) || { echo "no postgres process on this host" >&2; exit 1; }
  for p in $(pgrep -x postgres); do
    t=$((t + $(awk -v k="$k" '{print int(($14 + $15) * 1000 / k)}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo $((t + $(awk -v k="$k" '{print int(($16 + $17) * 1000 / k)}' "/proc/$pm/stat")))
}
# WAL position in bytes (0 on SQLite).
wal() {
  [ "$STORE" = postgres ] || { echo 0; return; }
  psql -qAt "$PGURL" -c "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn" || { echo "cannot read the WAL position" >&2; exit 1; }
}
# pass FILE: runs one sweep; FILE gets "bodies cpu_ms pg_cpu_ms wal_bytes".
pass() {
  local p0 w0 out
  p0=$(pg_cpu); w0=$(wal)
  out=$(/usr/bin/time -f '%U %S' -o "$work/time" "$B" sweep "${store[@]}" --body-retention-days 0 --json)
  local bodies; bodies=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bodies"])')
  echo "$bodies $(awk '{print int(($1 + $2) * 1000)}' "$work/time") $(($(pg_cpu) - p0)) $(($(wal) - w0))" >"$1"
}
pass "$work/full"
pass "$work/empty"
read -r n cpu pg w <"$work/full"
read -r _ cpu0 pg0 w0 <"$work/empty"
[ "$n" -gt 0 ] || { echo "sweep: no body was removed (no receipt settled?)" >&2; exit 1; }
awk -v n="$n" -v c="$cpu" -v c0="$cpu0" -v p="$pg" -v p0="$pg0" -v w="$w" -v w0="$w0" -v s="$STORE" 'BEGIN {
  per = (c - c0) * 1000 / n
  line = sprintf("sweep: %d bodies removed, %.1f us CPU per body (process CPU: pass %d ms, empty pass %d ms)", n, per, c, c0)
  if (s == "postgres")
    line = line sprintf("; PostgreSQL %.1f us CPU and %.0f B WAL per body", (p - p0) * 1000 / n, (w - w0) / n)
  print line
}'
