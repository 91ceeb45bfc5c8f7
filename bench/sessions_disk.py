#!/usr/bin/env python3
"""Disk bytes per idle session, and where they go (issue #10).

Starts a server on a fresh store (SQLite in a temp dir, or PostgreSQL in a fresh schema), creates N
sessions of the quickstart's `pr-session` workflow through the API (`POST /v1/runs`), arms one wait with
a far deadline on each (`POST /v1/runs/{id}/waits`), stops the server, and prints the store's bytes per
session, in all and per table (with its indexes).

    cargo build --release && bench/sessions_disk.py                  # SQLite, N=2000
    bench/sessions_disk.py --postgres --count 2000                   # PostgreSQL (PGURL or the default)

SQLite bytes come from the `dbstat` table (pages of each table and index, after a checkpoint);
PostgreSQL bytes from `pg_total_relation_size` of each table (heap, indexes, TOAST) after a VACUUM.
An empty store is measured first and subtracted.
"""
import argparse
import concurrent.futures
import json
import os
import sqlite3
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = 18187


def call(method, path, body=None):
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read() or b"null")


def session(_):
    st, r = call("POST", "/v1/runs", {"workflowId": "pr-session"})
    assert st == 201, r
    run = r["runId"]
    for _ in range(300):  # the session starts when its delivery is attempted (a moment later)
        if call("GET", f"/v1/runs/{run}")[1].get("status") == "running":
            break
        time.sleep(0.02)
    st, w = call("POST", f"/v1/runs/{run}/waits",
                 {"kind": "signal", "names": ["ci.done"], "timeoutMs": 86_400_000, "reason": "ci"})
    assert st in (200, 201), w
    return run


def sqlite_tables(path):
    c = sqlite3.connect(path)
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = c.execute(
        "SELECT COALESCE(m.tbl_name, d.name), SUM(d.pgsize) FROM dbstat d "
        "LEFT JOIN sqlite_schema m ON m.name = d.name GROUP BY 1").fetchall()
    return {t: b for t, b in rows}


def pg_tables(url, schema):
    out = subprocess.run(
        ["psql", "-qAt", url, "-c", "VACUUM", "-c",
         f"SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
         f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{schema}' AND c.relkind = 'r'"],
        check=True, capture_output=True, text=True).stdout
    return {l.split("|")[0]: int(l.split("|")[1]) for l in out.splitlines() if "|" in l}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/trigger-bridge"))
    a = ap.parse_args()
    env = dict(os.environ, GITHUB_WEBHOOK_SECRET="dev-github-secret",
               STANDARD_WEBHOOK_SECRET="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", RUST_LOG="warn")
    tmp = tempfile.mkdtemp()
    args = [a.bin, "serve", "--config", os.path.join(ROOT, "examples/quickstart.toml"),
            "--listen", f"127.0.0.1:{PORT}", "--data-dir", os.path.join(tmp, "data")]
    url = schema = None
    if a.postgres:
        base = os.environ.get("PGURL", "postgres://postgres@127.0.0.1:5432/test")
        schema = f"tb_sessions_{os.getpid()}"
        subprocess.run(["psql", "-qAt", base, "-c", f"CREATE SCHEMA {schema}"], check=True)
        url = f"{base}?options=-c%20search_path%3D{schema}"
        args += ["--database-url", url]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                call("GET", "/health")
                break
            except Exception:
                time.sleep(0.1)
        measure = (lambda: pg_tables(base, schema)) if a.postgres else \
            (lambda: sqlite_tables(os.path.join(tmp, "data/trigger-bridge.db")))
        empty = measure()
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(ex.map(session, range(a.count)))
        secs = time.time() - t0
        server.terminate()
        server.wait(30)
        full = measure()
    finally:
        if server.poll() is None:
            server.kill()
        if a.postgres:
            subprocess.run(["psql", "-qAt", base, "-c", f"DROP SCHEMA {schema} CASCADE"], check=False,
                           capture_output=True)
    grown = {t: full.get(t, 0) - empty.get(t, 0) for t in full}
    total = sum(grown.values())
    print(f"{'postgres' if a.postgres else 'sqlite'}: {a.count} idle sessions with an armed wait "
          f"in {secs:.1f} s: {total / a.count:.0f} bytes per session")
    for t, b in sorted(grown.items(), key=lambda x: -x[1]):
        if b > 0:
            print(f"  {t:24} {b / a.count:8.0f} B/session")


if __name__ == "__main__":
    main()
