//! A receipt's raw body is its row's `body` column (SQLite migration 0021, PostgreSQL 0015;
//! docs/architecture.md, "Storage"), on every backend: written by the receipt's own insert (one row per
//! receipt, no `bodies` table), `NULL` when empty, read back byte for byte (binary, empty, large, alone
//! or in a shared batch), set to `NULL` by the retention sweeper, and moved in whole from the `bodies`
//! table of a store written by the previous release.

mod support;

use std::sync::Arc;
use std::time::Duration;

use ::postgres::types::ToSql;
use bytes::Bytes;
use serde_json::json;
use tb_core::delivery::{DeliveryKind, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tokio::sync::Barrier;
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{self as pg, PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

/// The longest a racing commit may take before the test fails.
const LIMIT: Duration = Duration::from_secs(60);

/// Rounds of racing commits on PostgreSQL until one batch of several receipts formed.
const ROUNDS: usize = 5;

/// What a test reads beside the store, straight from the database.
trait Raw: Send + Sync {
    /// The `body` column of receipt `id` (`None`: `NULL`); panics when there is no such receipt.
    fn body(&self, id: &str) -> Option<Vec<u8>>;
    /// Whether a table named `bodies` exists.
    fn has_bodies_table(&self) -> bool;
}

struct SqliteRaw(std::path::PathBuf);

impl Raw for SqliteRaw {
    fn body(&self, id: &str) -> Option<Vec<u8>> {
        let c = rusqlite::Connection::open(&self.0).unwrap();
        c.query_row("SELECT body FROM receipts WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap()
    }

    fn has_bodies_table(&self) -> bool {
        let c = rusqlite::Connection::open(&self.0).unwrap();
        let n: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'bodies'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        n == 1
    }
}

struct PgRaw(tokio_postgres::Config);

impl PgRaw {
    /// Runs `f` on a connection of its own, off the test's runtime (the sync client runs its own).
    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut ::postgres::Client) -> T + Send + 'static,
    ) -> T {
        let cfg = self.0.clone();
        std::thread::spawn(move || f(&mut pg::connect(&cfg).unwrap()))
            .join()
            .unwrap()
    }
}

impl Raw for PgRaw {
    fn body(&self, id: &str) -> Option<Vec<u8>> {
        let id = id.to_string();
        self.with(move |c| {
            c.query_one("SELECT body FROM receipts WHERE id = $1", &[&id])
                .unwrap()
                .get(0)
        })
    }

    fn has_bodies_table(&self) -> bool {
        self.with(|c| {
            c.query_one("SELECT to_regclass('bodies') IS NOT NULL", &[])
                .unwrap()
                .get(0)
        })
    }
}

/// A store, its raw reader, its largest batches so far, and what keeps its storage alive.
struct Handle {
    name: &'static str,
    store: Arc<dyn Store>,
    raw: Box<dyn Raw>,
    largest: Box<dyn Fn() -> usize + Send + Sync>,
    _guard: Box<dyn std::any::Any + Send>,
}

/// SQLite always; PostgreSQL unless the server is unreachable and `CI` is unset.
async fn handles() -> Vec<Handle> {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = Arc::new(SqliteStore::open_dir(dir.path()).expect("open sqlite"));
    let s2 = sqlite.clone();
    let mut out = vec![Handle {
        name: "sqlite",
        store: sqlite,
        raw: Box::new(SqliteRaw(dir.path().join("trigger-bridge.db"))),
        largest: Box::new(move || s2.largest_batches().0),
        _guard: Box::new(dir),
    }];
    if let Some(db) = TestDatabase::create() {
        let opts = PoolOptions {
            connections: 8,
            queue_capacity: 10_000,
        };
        let pg = Arc::new(
            PgStore::connect(db.url(), opts)
                .await
                .expect("open postgres"),
        );
        let p2 = pg.clone();
        out.push(Handle {
            name: "postgres",
            store: pg,
            raw: Box::new(PgRaw(db.config())),
            largest: Box::new(move || p2.largest_batches().0),
            _guard: Box::new(db),
        });
    }
    out
}

async fn subscription(s: &dyn Store) {
    support::webhook_subscription(s, "s").await;
}

/// A receipt of `body` for dedup key `key`, received at `at` (ms): routed to one pending delivery,
/// or unmatched (settled) when `settled`.
fn receipt(key: &str, body: Vec<u8>, at: i64, settled: bool) -> NewReceipt {
    NewReceipt {
        id: new_id(IdKind::Receipt),
        source: ReceiptSource::Webhook,
        subscription_id: "s".into(),
        dedup_key: key.into(),
        provider_event_id: format!("pe-{key}"),
        event_type: "push".into(),
        normalized: json!({"event": "push"}),
        state: if settled {
            ReceiptState::Unmatched
        } else {
            ReceiptState::Routed
        },
        content_type: Some("application/octet-stream".into()),
        body: Bytes::from(body),
        received_at: at,
        dedup_until: at + 86_400_000,
        deliveries: if settled {
            vec![]
        } else {
            vec![NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: DeliveryKind::Binding,
                binding_id: "b".into(),
                action: "start_run".into(),
                workflow_id: Some("noop".into()),
                run_id: Some(new_id(IdKind::Run)),
                inputs: json!({}),
                params: None,
                state: DeliveryState::Pending,
                dead_letter_reason: None,
            }]
        },
        capability: None,
        lease: None,
        trace_context: None,
    }
}

/// Every byte value, NULs and invalid UTF-8 included.
fn binary() -> Vec<u8> {
    (0..=255u8).chain((0..=255u8).rev()).collect()
}

/// `n` bytes of a fixed pseudo-random sequence (incompressible, so PostgreSQL stores it out of line).
fn large(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Asserts receipt `id` reads back `want` through the store and holds it in its own row (`NULL`
/// when empty), with `body_bytes` its length.
async fn assert_body(h: &Handle, id: &str, want: &[u8]) {
    let got = h.store.get_body(id).await.unwrap();
    assert!(
        got[..] == *want,
        "{}: {id}: {} bytes read",
        h.name,
        got.len()
    );
    let raw = h.raw.body(id);
    if want.is_empty() {
        assert_eq!(raw, None, "{}: {id}: an empty body is NULL", h.name);
    } else {
        assert!(
            raw.as_deref() == Some(want),
            "{}: {id}: the row holds the body",
            h.name
        );
    }
    let r = h.store.get_receipt(id).await.unwrap();
    assert_eq!(r.body_bytes, want.len() as u64, "{}: {id}", h.name);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receipts_body_round_trips_in_its_own_row() {
    for h in handles().await {
        subscription(&*h.store).await;
        assert!(!h.raw.has_bodies_table(), "{}: no bodies table", h.name);
        // One at a time (the single path).
        let bodies = [
            binary(),
            vec![],
            vec![0],
            large(3 << 20, 7),
            br#"{"a":"\u00e9"}"#.to_vec(),
        ];
        for (i, body) in bodies.iter().enumerate() {
            let r = receipt(&format!("one-{i}"), body.clone(), 2_000, false);
            let id = r.id.clone();
            let out = h.store.commit_receipt(r).await.unwrap();
            assert!(matches!(out, IngestOutcome::Accepted { .. }), "{}", h.name);
            assert_body(&h, &id, body).await;
        }
        // A duplicate of a stored key leaves the first body as it was.
        let dup = receipt("one-0", b"another body".to_vec(), 2_001, false);
        let first = match h.store.commit_receipt(dup).await.unwrap() {
            IngestOutcome::Duplicate { receipt_id, .. } => receipt_id,
            other => panic!("{}: a duplicate, got {other:?}", h.name),
        };
        assert_body(&h, &first, &bodies[0]).await;

        // Raced (on PostgreSQL several share one transaction and one multi-row insert).
        let mut batched = false;
        for round in 0..ROUNDS {
            let n = 24;
            let barrier = Arc::new(Barrier::new(n));
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    let body = match i % 4 {
                        0 => vec![],
                        1 => binary(),
                        2 => large(64 << 10, i as u64),
                        _ => format!("{{\"i\":{i}}}").into_bytes(),
                    };
                    let r = receipt(&format!("r{round}-{i}"), body.clone(), 3_000, false);
                    let (s, b) = (h.store.clone(), barrier.clone());
                    tokio::spawn(async move {
                        b.wait().await;
                        let id = r.id.clone();
                        (id, body, s.commit_receipt(r).await)
                    })
                })
                .collect();
            for t in tasks {
                let (id, body, out) = tokio::time::timeout(LIMIT, t)
                    .await
                    .expect("a racing commit took too long")
                    .unwrap();
                assert!(
                    matches!(out, Ok(IngestOutcome::Accepted { .. })),
                    "{}: {out:?}",
                    h.name
                );
                assert_body(&h, &id, &body).await;
            }
            if (h.largest)() > 1 {
                batched = true;
                break;
            }
        }
        if h.name == "postgres" {
            assert!(batched, "postgres: no batch of several receipts formed");
        }
    }
}

#[tokio::test]
async fn the_sweeper_sets_a_settled_old_body_to_null_and_keeps_the_rest() {
    for h in handles().await {
        let s = &*h.store;
        subscription(s).await;
        // Old: settled with a body (swept), settled and empty (nothing to sweep), unsettled (kept).
        // Young: settled (kept, within the retention).
        let old_settled = receipt("old-settled", binary(), 2_000, true);
        let old_empty = receipt("old-empty", vec![], 2_001, true);
        let old_routed = receipt("old-routed", b"queued".to_vec(), 2_002, false);
        let young = receipt("young", b"young".to_vec(), 50_000, true);
        let ids: Vec<String> = [&old_settled, &old_empty, &old_routed, &young]
            .iter()
            .map(|r| r.id.clone())
            .collect();
        for r in [old_settled, old_empty, old_routed, young] {
            s.commit_receipt(r).await.unwrap();
        }
        let page = s
            .sweep(100_000, 10_000, 10_000, 100, SweepCursor::default())
            .await
            .unwrap();
        assert_eq!(page.next, None, "{}", h.name);
        assert_eq!(
            page.counts.bodies, 1,
            "{}: only the old settled body",
            h.name
        );
        assert!(
            matches!(s.get_body(&ids[0]).await, Err(StoreError::NotFound { .. })),
            "{}: a swept body is gone",
            h.name
        );
        assert_eq!(h.raw.body(&ids[0]), None, "{}: its column is NULL", h.name);
        let kept = s.get_receipt(&ids[0]).await.unwrap();
        assert_eq!(kept.body_bytes, 512, "{}: the receipt stays whole", h.name);
        assert_eq!(kept.state, ReceiptState::Unmatched, "{}", h.name);
        assert_body(&h, &ids[1], b"").await;
        assert_body(&h, &ids[2], b"queued").await;
        assert_body(&h, &ids[3], b"young").await;
        // A second pass finds nothing more.
        let again = s
            .sweep(100_000, 10_000, 10_000, 100, SweepCursor::default())
            .await
            .unwrap();
        assert_eq!(again.counts, SweepCounts::default(), "{}", h.name);
    }
}

/// The sweeper's walk reads the receipts holding a body by their partial index, not every old
/// receipt (`tb_core::retention::body_walk_ends`: a pass costs the old bodies, not the whole table).
#[test]
fn the_body_walk_searches_the_partial_index() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    trigger_bridge_store::sqlite::migrate(&conn).unwrap();
    let plan: Vec<String> = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT id, state, received_at FROM receipts \
             WHERE body IS NOT NULL AND id > ?1 ORDER BY id LIMIT ?2",
        )
        .unwrap()
        .query_map(rusqlite::params!["", 100], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        plan,
        ["SEARCH receipts USING INDEX receipts_body_held (id>?)"]
    );
}

/// One receipt as the previous release stored it, and what it must read back after the upgrade.
struct Old {
    id: &'static str,
    /// `receipts.body_bytes`.
    len: i64,
    /// Its `bodies` row, if any (none for an empty body, and none once swept).
    row: Option<Vec<u8>>,
    /// What `get_body` answers after the upgrade (`None`: not found).
    reads: Option<Vec<u8>>,
}

fn old_receipts() -> Vec<Old> {
    let big = large(2 << 20, 3);
    vec![
        Old {
            id: "rcpt_bin",
            len: 512,
            row: Some(binary()),
            reads: Some(binary()),
        },
        Old {
            id: "rcpt_big",
            len: big.len() as i64,
            row: Some(big.clone()),
            reads: Some(big),
        },
        Old {
            id: "rcpt_json",
            len: 8,
            row: Some(br#"{"a": 1}"#.to_vec()),
            reads: Some(br#"{"a": 1}"#.to_vec()),
        },
        Old {
            id: "rcpt_empty",
            len: 0,
            row: None,
            reads: Some(vec![]),
        },
        Old {
            id: "rcpt_swept",
            len: 40,
            row: None,
            reads: None,
        },
    ]
}

/// The receipts' insert at the previous versions (SQLite 20, PostgreSQL 14), in `?n` / `$n` form.
fn insert_receipt(dollar: bool) -> String {
    let sql =
        "INSERT INTO receipts (id, subscription_id, dedup_key, provider_event_id, event_type, \
               normalized, state, body_bytes, received_at, updated_at, dedup_until, source) \
               VALUES (?1, 's', ?1, ?1, 'push', '{}', 'routed', ?2, 1, 1, 1, 'webhook')";
    if dollar {
        sql.replace('?', "$")
    } else {
        sql.to_string()
    }
}

async fn assert_upgraded(h: &Handle, olds: &[Old]) {
    assert!(!h.raw.has_bodies_table(), "{}: bodies dropped", h.name);
    for o in olds {
        match &o.reads {
            Some(want) => assert_body(h, o.id, want).await,
            None => {
                assert!(
                    matches!(
                        h.store.get_body(o.id).await,
                        Err(StoreError::NotFound { .. })
                    ),
                    "{}: {}: still swept",
                    h.name,
                    o.id
                );
                assert_eq!(h.raw.body(o.id), None, "{}: {}", h.name, o.id);
            }
        }
    }
    // The upgraded store writes and sweeps as a new one.
    subscription(&*h.store).await;
    let r = receipt("after", b"after".to_vec(), 2_000, true);
    let id = r.id.clone();
    h.store.commit_receipt(r).await.unwrap();
    assert_body(h, &id, b"after").await;
    let page = h
        .store
        .sweep(100_000, 10_000, 10_000, 100, SweepCursor::default())
        .await
        .unwrap();
    assert_eq!(page.counts.bodies, 1, "{}: the old ones are routed", h.name);
    assert_eq!(h.raw.body(&id), None, "{}", h.name);
}

#[tokio::test]
async fn a_sqlite_store_with_a_bodies_table_keeps_every_body() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trigger-bridge.db");
    let olds = old_receipts();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(
            trigger_bridge_store::sqlite::migrate_to(&conn, 20).unwrap(),
            (0, 20)
        );
        for o in &olds {
            conn.execute(&insert_receipt(false), rusqlite::params![o.id, o.len])
                .unwrap();
            if let Some(b) = &o.row {
                conn.execute(
                    "INSERT INTO bodies (receipt_id, body) VALUES (?1, ?2)",
                    rusqlite::params![o.id, b],
                )
                .unwrap();
            }
        }
    }
    // Opening the store migrates it to the newest version.
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let s2 = store.clone();
    let h = Handle {
        name: "sqlite",
        store,
        raw: Box::new(SqliteRaw(path.clone())),
        largest: Box::new(move || s2.largest_batches().0),
        _guard: Box::new(()),
    };
    assert_upgraded(&h, &olds).await;
}

#[tokio::test]
async fn a_postgres_store_with_a_bodies_table_keeps_every_body() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let raw = PgRaw(db.config());
    let olds = Arc::new(old_receipts());
    let o2 = olds.clone();
    raw.with(move |c| {
        for (v, sql) in pg::MIGRATIONS.iter().filter(|(v, _)| *v <= 14) {
            c.batch_execute(sql).unwrap();
            c.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, \
                 applied_at BIGINT NOT NULL); INSERT INTO schema_migrations VALUES ({v}, 0)"
            ))
            .unwrap();
        }
        assert_eq!(pg::schema_version(c).unwrap(), 14);
        for o in o2.iter() {
            let row: [&(dyn ToSql + Sync); 2] = [&o.id, &o.len];
            c.execute(&insert_receipt(true), &row).unwrap();
            if let Some(b) = &o.row {
                let row: [&(dyn ToSql + Sync); 2] = [&o.id, b];
                c.execute(
                    "INSERT INTO bodies (receipt_id, body) VALUES ($1, $2)",
                    &row,
                )
                .unwrap();
            }
        }
    });
    // Connecting migrates it to the newest version.
    let store = Arc::new(
        PgStore::connect(db.url(), PoolOptions::default())
            .await
            .unwrap(),
    );
    let s2 = store.clone();
    let h = Handle {
        name: "postgres",
        store,
        raw: Box::new(raw),
        largest: Box::new(move || s2.largest_batches().0),
        _guard: Box::new(db),
    };
    assert_upgraded(&h, &olds).await;
}
