#!/usr/bin/env bash
# End to end with an independent load tool: wrk replays pre-signed Standard Webhooks requests (presign.py,
# replay.lua) to the `outbound` subscription of bench/bench.toml, whose `http` runs are delivered to a minimal
# receiver (receiver.py) that counts distinct webhook-ids. The figure is what the receiver got, per second of
# wall time from the first request to the last delivery; the server's CPU per event from /proc.
#
#   bench/wrk/run.sh BINARY                   # COUNT=20000 CONN=64 THREADS=2 by default
#   COUNT=100000 CONN=16 bench/wrk/run.sh target/release/trigger-bridge
#   STORE=postgres bench/wrk/run.sh BINARY    # one replica on PostgreSQL (PGURL), a fresh schema per run
#
# STORE=postgres: the server stores in a fresh schema of PGURL (default postgres://postgres@127.0.0.1:5432/test),
# dropped afterwards, and the CPU of every PostgreSQL process is counted too (so run it alone on the database).
# Needs wrk (Debian package `wrk`) and python3 (and psql for STORE=postgres). Uses 127.0.0.1:18181 (server)
# and 127.0.0.1:18091 (receiver).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:?usage: bench/wrk/run.sh BINARY}
COUNT=${COUNT:-20000}
CONN=${CONN:-64}
THREADS=${THREADS:-2}
STORE=${STORE:-sqlite}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432/test}
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 2; }
case $STORE in
  sqlite) ;;
  postgres) command -v psql >/dev/null || { echo "psql not found: apt-get install postgresql-client" >&2; exit 2; } ;;
  *) echo "STORE must be sqlite or postgres" >&2; exit 2 ;;
esac
export STANDARD_WEBHOOK_SECRET=${STANDARD_WEBHOOK_SECRET:-whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
work=$(mktemp -d)
pids=()
schema=
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null
  [ -n "$schema" ] && psql -q "$PGURL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
sed "s|^data_dir = .*|data_dir = \"$work/data\"|" bench/bench.toml >"$work/bench.toml"
store_args=()
if [ "$STORE" = postgres ]; then
  schema="tb_wrk_$$"
  psql -q "$PGURL" -c "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema" >/dev/null
  sep='?'; case $PGURL in *\?*) sep='&' ;; esac
  store_args=(--database-url "$PGURL${sep}options=-c%20search_path%3D$schema&application_name=$schema" --replica-id wrk1)
fi
python3 bench/wrk/receiver.py --listen 127.0.0.1:18091 2>"$work/receiver.log" &
pids+=($!)
"$BIN" serve --config "$work/bench.toml" "${store_args[@]}" >"$work/server.log" 2>&1 &
server=$!
pids+=($server)
for _ in $(seq 1 200); do
  curl -fsS -o /dev/null http://127.0.0.1:18181/health 2>/dev/null &&
    curl -fsS -o /dev/null http://127.0.0.1:18091/count 2>/dev/null && break
  sleep 0.1
done
curl -fsS -o /dev/null http://127.0.0.1:18181/health || { tail -n 20 "$work/server.log" >&2; exit 1; }
curl -fsS -o /dev/null http://127.0.0.1:18091/count || { cat "$work/receiver.log" >&2; exit 1; }
python3 bench/wrk/presign.py --count "$COUNT" --out "$work/requests.tsv"
cpu_ms() { awk -v t="$(getconf CLK_TCK)" '{print int(($14 + $15) * 1000 / t)}' "/proc/$server/stat"; }
# CPU of every PostgreSQL process: pg_snapshot FILE writes "pid ms" lines; pg_cpu_since FILE prints the ms
# they used since (a process started meanwhile counts in full; one that ended meanwhile is lost). 0 on SQLite.
pg_snapshot() {
  local p
  : >"$1"
  [ "$STORE" = postgres ] || return 0
  for p in $(pgrep -x postgres || true); do
    awk -v p="$p" -v k="$(getconf CLK_TCK)" '{print p, int(($14 + $15) * 1000 / k)}' "/proc/$p/stat" 2>/dev/null >>"$1" || true
  done
}
pg_cpu_since() {
  pg_snapshot "$1.end"
  awk 'NR == FNR {before[$1] = $2; next} {t += $2 - before[$1]} END {print t + 0}' "$1" "$1.end"
}
c0=$(cpu_ms)
pg_snapshot "$work/pg.cpu"
t0=$(date +%s.%N)
wrk -t"$THREADS" -c"$CONN" -d600s -s bench/wrk/replay.lua http://127.0.0.1:18181 -- \
  "$work/requests.tsv" /v1/trigger-subscriptions/outbound/ingest "$THREADS" "$work/marker" >"$work/wrk.out" &
wrk_pid=$!
pids+=($wrk_pid)
# Bounded: every thread has all its answers (a marker each), or 600 s.
for _ in $(seq 1 6000); do
  [ "$(ls "$work"/marker.* 2>/dev/null | wc -l)" -ge "$THREADS" ] && break
  kill -0 "$wrk_pid" 2>/dev/null || break
  sleep 0.1
done
t_ingest=$(date +%s.%N)
kill -INT "$wrk_pid" 2>/dev/null || true
wait "$wrk_pid" || true
cat "$work/wrk.out"
accepted=$(grep -o '202=[0-9]*' "$work/wrk.out" | cut -d= -f2 || true)
accepted=${accepted:-0}
# Wait (bounded: 120 s, or 10 s without progress) until the receiver has every accepted event.
last=-1; still=0
for _ in $(seq 1 1200); do
  got=$(curl -fsS http://127.0.0.1:18091/count | python3 -c 'import json,sys; print(json.load(sys.stdin)["distinct"])')
  [ "$got" -ge "$accepted" ] && break
  if [ "$got" = "$last" ]; then still=$((still + 1)); [ "$still" -ge 100 ] && break; else still=0; fi
  last=$got
  sleep 0.1
done
c1=$(cpu_ms)
pg_ms=$(pg_cpu_since "$work/pg.cpu")
curl -fsS http://127.0.0.1:18091/count | python3 -c '
import json, sys
c = json.load(sys.stdin)
t0, accepted, cpu_ms, t_ingest = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
store, pg_ms = sys.argv[5], int(sys.argv[6])
wall = (c["last"] or t0) - t0
d = c["distinct"]
posts = c["posts"]
print(f"ingest: {accepted} accepted in {t_ingest - t0:.2f} s ({accepted / (t_ingest - t0):.0f}/s)")
print(f"delivered {d} distinct ({posts} POSTs), last one {wall:.2f} s after the first request")
if d:
    print(f"end to end: {d / wall:.0f} events/s, server CPU {cpu_ms * 1000 / d:.0f} us per event")
    if store == "postgres":
        print(f"postgres: PostgreSQL CPU {pg_ms * 1000 / d:.0f} us per event (every postgres process), "
              f"server + PostgreSQL {(cpu_ms + pg_ms) * 1000 / d:.0f} us per event")
if d < accepted:
    print(f"MISSING: {accepted - d} accepted events never reached the receiver", file=sys.stderr)
    sys.exit(1)
' "$t0" "$accepted" "$((c1 - c0))" "$t_ingest" "$STORE" "$pg_ms"
