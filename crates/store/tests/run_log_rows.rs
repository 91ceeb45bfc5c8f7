//! The rows one event costs, on every backend, and how a run's first events are stored: an attempt
//! that starts a run writes the run's first events (`tb_core::attempt::first_events`: `run.started`,
//! the delivered `trigger.delivery.attempted`, and the terminal event of a run already ended) as ONE
//! `run_events` row (`crates/store/src/sql/packed_events.rs`; docs/architecture.md §7), and every
//! reader sees them as the separate events they are: pages of the log by `after` and `limit`, the read
//! by event id, and the outbox deliveries that name an event. A log written before (one row per event)
//! reads the same.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use tb_core::attempt::{AttemptReport, RunStart};
use tb_core::delivery::{AttemptDecision, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::run::RunStatus;
use tb_core::subscription::{FailurePolicy, Source};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{self as pg, PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

/// Plain SQL on a backend's storage, beside the store (a test's own connection).
enum Raw {
    Sqlite(PathBuf),
    Postgres(Box<tokio_postgres::Config>),
}

/// A SQL text literal (test values only).
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Raw {
    /// Runs `sql` (statements without results).
    fn exec(&self, sql: &str) {
        match self {
            Raw::Sqlite(file) => rusqlite::Connection::open(file)
                .unwrap()
                .execute_batch(sql)
                .unwrap(),
            Raw::Postgres(config) => {
                let (config, sql) = ((**config).clone(), sql.to_string());
                // The postgres client runs its own runtime: keep it off the test's.
                std::thread::spawn(move || pg::connect(&config).unwrap().batch_execute(&sql))
                    .join()
                    .unwrap()
                    .unwrap()
            }
        }
    }

    /// The single integer `sql` answers.
    fn count(&self, sql: &str) -> i64 {
        match self {
            Raw::Sqlite(file) => rusqlite::Connection::open(file)
                .unwrap()
                .query_row(sql, [], |r| r.get(0))
                .unwrap(),
            Raw::Postgres(config) => {
                let (config, sql) = ((**config).clone(), sql.to_string());
                std::thread::spawn(move || {
                    pg::connect(&config)
                        .unwrap()
                        .query_one(&sql, &[])
                        .unwrap()
                        .get::<_, i64>(0)
                })
                .join()
                .unwrap()
            }
        }
    }

    /// The text rows `sql` answers (every column read as text).
    fn texts(&self, sql: &str) -> Vec<Vec<String>> {
        match self {
            Raw::Sqlite(file) => {
                let c = rusqlite::Connection::open(file).unwrap();
                let mut st = c.prepare(sql).unwrap();
                let n = st.column_count();
                st.query_map([], |r| (0..n).map(|i| r.get::<_, String>(i)).collect())
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap()
            }
            Raw::Postgres(config) => {
                let (config, sql) = ((**config).clone(), sql.to_string());
                std::thread::spawn(move || {
                    pg::connect(&config)
                        .unwrap()
                        .query(&sql, &[])
                        .unwrap()
                        .iter()
                        .map(|r| (0..r.len()).map(|i| r.get::<_, String>(i)).collect())
                        .collect()
                })
                .join()
                .unwrap()
            }
        }
    }

    /// Every table of the store (the migrations' bookkeeping left out).
    fn tables(&self) -> Vec<String> {
        let sql = match self {
            Raw::Sqlite(_) => {
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
                 AND name NOT LIKE '%migrations%' ORDER BY name"
            }
            Raw::Postgres(_) => {
                "SELECT table_name::TEXT FROM information_schema.tables WHERE table_schema = current_schema() \
                 AND table_type = 'BASE TABLE' AND table_name NOT LIKE '%migrations%' ORDER BY 1"
            }
        };
        self.texts(sql)
            .into_iter()
            .map(|mut r| r.remove(0))
            .collect()
    }

    /// Rows per table.
    fn rows(&self) -> BTreeMap<String, i64> {
        self.tables()
            .into_iter()
            .map(|t| {
                let n = self.count(&format!("SELECT COUNT(*) FROM \"{t}\""));
                (t, n)
            })
            .collect()
    }
}

/// A store, its raw access, and what keeps its storage alive (a temp dir, a test schema).
type Backend = (
    &'static str,
    Arc<dyn Store>,
    Raw,
    Box<dyn std::any::Any + Send>,
);

/// Fresh stores of every backend.
async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let raw = Raw::Sqlite(s.path().to_path_buf());
    let mut out: Vec<Backend> = vec![("sqlite", Arc::new(s), raw, Box::new(dir))];
    if let Some(db) = TestDatabase::create() {
        let store = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        let raw = Raw::Postgres(Box::new(db.config()));
        out.push(("postgres", Arc::new(store), raw, Box::new(db)));
    }
    out
}

async fn subscription(s: &dyn Store) {
    s.upsert_subscription(
        SubscriptionDef {
            id: "s".into(),
            source: Source::Webhook,
            connector: "github".into(),
            config: json!({}),
            failure_threshold: 0,
        },
        1_000,
    )
    .await
    .unwrap();
}

/// Ingests one webhook event with one `start_run` binding of workflow `noop`; its run id.
async fn ingest(s: &dyn Store, key: &str, now: i64) -> String {
    let run_id = new_id(IdKind::Run);
    s.commit_receipt(NewReceipt {
        id: new_id(IdKind::Receipt),
        source: tb_core::receipt::ReceiptSource::Webhook,
        subscription_id: "s".into(),
        dedup_key: key.into(),
        provider_event_id: format!("pe-{key}"),
        event_type: "pull_request.opened".into(),
        normalized: json!({"event": "pull_request", "action": "opened"}),
        state: ReceiptState::Routed,
        content_type: Some("application/json".into()),
        body: Bytes::from_static(b"{\"pr\":1}"),
        received_at: now,
        dedup_until: now + 86_400_000,
        deliveries: vec![NewDelivery {
            id: new_id(IdKind::Delivery),
            kind: tb_core::delivery::DeliveryKind::Binding,
            binding_id: "b1".into(),
            action: "start_run".into(),
            workflow_id: Some("noop".into()),
            run_id: Some(run_id.clone()),
            inputs: json!({"pr": 1}),
            params: None,
            state: DeliveryState::Pending,
            dead_letter_reason: None,
        }],
        capability: None,
        lease: None,
        trace_context: None,
    })
    .await
    .unwrap();
    run_id
}

/// The delivered attempt of `lease` that starts its run with `status` at `now`; with its event id.
fn start(lease: &Lease, status: RunStatus, now: i64) -> (AttemptCommit, String) {
    let event_id = new_id(IdKind::Event);
    let commit = AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: lease.token.clone(),
                attempt: lease.delivery.attempts + 1,
            },
            event_id: event_id.clone(),
            decision: AttemptDecision::Delivered,
            failure: None,
            started_at: now,
            duration_ms: 3,
            run: Some(RunStart {
                id: lease.delivery.run_id.clone().unwrap(),
                workflow_id: "noop".into(),
                inputs: json!({"pr": 1}),
                status,
                dead_letter: None,
                session: false,
            }),
            effect: None,
            failure_policy: FailurePolicy::default(),
        },
        effect: None,
        now,
    };
    (commit, event_id)
}

/// Ingests one event and commits the attempt that starts its noop run with `status` at `now`: the run
/// id and the attempt's event id.
async fn started_run(s: &dyn Store, key: &str, status: RunStatus, now: i64) -> (String, String) {
    let run_id = ingest(s, key, now).await;
    let lease = s
        .lease_due("w", now, 60_000, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.delivery.run_id.as_deref() == Some(run_id.as_str()))
        .unwrap();
    let (commit, event_id) = start(&lease, status, now);
    s.commit_attempt(commit).await.unwrap();
    (run_id, event_id)
}

fn run_event_rows(raw: &Raw, run: &str) -> i64 {
    raw.count(&format!(
        "SELECT COUNT(*) FROM run_events WHERE run_id = {}",
        lit(run)
    ))
}

/// Every page of `run`'s log (`after` none, 0, 1, 2; `limit` 1, 2, 3, 100) and every read by id agree
/// with `full`, the whole log.
async fn pages_agree(s: &dyn Store, run: &str, full: &[RunEventRecord]) {
    for after in [None, Some(0), Some(1), Some(2), Some(3)] {
        for limit in [1, 2, 3, 100] {
            let want: Vec<RunEventRecord> = full
                .iter()
                .filter(|e| after.is_none_or(|a| e.sequence > a))
                .take(limit as usize)
                .cloned()
                .collect();
            let got = s.run_events(run, after, limit).await.unwrap();
            assert_eq!(got, want, "after {after:?}, limit {limit}");
        }
    }
    for e in full {
        assert_eq!(&s.get_run_event(run, &e.event_id).await.unwrap(), e);
    }
    assert!(matches!(
        s.get_run_event(run, "evt_00000000000000000000000000000000")
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

/// Replaces `run`'s log with one row per event, as the store wrote it before the first events were
/// packed: each payload without what the run row holds (`tb_core::events::stored_payload`).
fn write_unpacked(raw: &Raw, full: &[RunEventRecord]) {
    let run = &full[0].run_id;
    let mut sql = format!("DELETE FROM run_events WHERE run_id = {};", lit(run));
    for e in full {
        let payload = tb_core::events::stored_payload(&e.event_type, run, &e.payload);
        sql.push_str(&format!(
            "INSERT INTO run_events (run_id, sequence, event_id, type, payload, causation_id, timestamp) \
             VALUES ({}, {}, {}, {}, {}, {}, {});",
            lit(run),
            e.sequence,
            lit(&e.event_id),
            lit(&e.event_type),
            lit(&payload.to_string()),
            e.causation_id.as_deref().map_or("NULL".to_string(), lit),
            e.timestamp
        ));
    }
    raw.exec(&sql);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_noop_run_writes_one_run_events_row_and_reads_as_its_three_events() {
    for (name, s, raw, _guard) in backends().await {
        subscription(&*s).await;
        let before = raw.rows();
        let (run, event_id) = started_run(&*s, "dk_1", RunStatus::Completed, 2_010).await;
        let after = raw.rows();
        let grown: BTreeMap<&str, i64> = after
            .iter()
            .map(|(t, n)| (t.as_str(), n - before.get(t).copied().unwrap_or(0)))
            .filter(|(_, n)| *n != 0)
            .collect();
        let total: i64 = grown.values().sum();
        println!("{name}: rows per started noop run: {total} {grown:?}");
        assert_eq!(grown["run_events"], 1, "{name}: {grown:?}");
        assert_eq!(run_event_rows(&raw, &run), 1);

        let full = s.run_events(&run, None, 100).await.unwrap();
        let attempted = json!({"subscriptionId": "s", "dedupKey": "dk_1", "attempt": 1,
                               "outcome": "delivered", "runId": run});
        let shapes: Vec<(u64, &str, &Value, Option<&str>, i64)> = full
            .iter()
            .map(|e| {
                (
                    e.sequence,
                    e.event_type.as_str(),
                    &e.payload,
                    e.causation_id.as_deref(),
                    e.timestamp,
                )
            })
            .collect();
        assert_eq!(
            shapes,
            vec![
                (
                    0,
                    "run.started",
                    &json!({"workflowId": "noop", "inputs": {"pr": 1}}),
                    Some(event_id.as_str()),
                    2_010
                ),
                (1, "trigger.delivery.attempted", &attempted, None, 2_010),
                (2, "run.completed", &json!({}), None, 2_010),
            ],
            "{name}"
        );
        assert_eq!(full[1].event_id, event_id, "the attempt keeps its event id");
        assert!(full.iter().all(|e| e.run_id == run));
        assert!(full[0].event_id.starts_with("evt_") && full[2].event_id.starts_with("evt_"));
        assert_eq!(s.get_run(&run).await.unwrap().status, RunStatus::Completed);
        pages_agree(&*s, &run, &full).await;

        // The same log written the way it was before (three rows) reads the same.
        write_unpacked(&raw, &full);
        assert_eq!(run_event_rows(&raw, &run), 3);
        assert_eq!(s.run_events(&run, None, 100).await.unwrap(), full);
        pages_agree(&*s, &run, &full).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_continues_its_log_after_the_packed_row() {
    for (name, s, raw, _guard) in backends().await {
        subscription(&*s).await;
        let (run, event_id) = started_run(&*s, "dk_1", RunStatus::Running, 2_010).await;
        assert_eq!(run_event_rows(&raw, &run), 1, "{name}");
        s.finish_run(&run, RunStatus::Completed, None, 2_500)
            .await
            .unwrap();
        assert_eq!(run_event_rows(&raw, &run), 2, "{name}");
        let full = s.run_events(&run, None, 100).await.unwrap();
        let got: Vec<(u64, &str, i64)> = full
            .iter()
            .map(|e| (e.sequence, e.event_type.as_str(), e.timestamp))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "run.started", 2_010),
                (1, "trigger.delivery.attempted", 2_010),
                (2, "run.completed", 2_500)
            ],
            "{name}"
        );
        assert_eq!(full[1].event_id, event_id);
        pages_agree(&*s, &run, &full).await;
        // Written the old way, the same.
        write_unpacked(&raw, &full);
        assert_eq!(run_event_rows(&raw, &run), 3);
        pages_agree(&*s, &run, &full).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_started_by_concurrent_attempts_write_one_row_each() {
    const RUNS: usize = 8;
    for (name, s, raw, _guard) in backends().await {
        subscription(&*s).await;
        let mut runs = Vec::new();
        for i in 0..RUNS {
            runs.push(ingest(&*s, &format!("dk_{i}"), 2_000).await);
        }
        let leases = s.lease_due("w", 2_000, 60_000, RUNS as u32).await.unwrap();
        assert_eq!(leases.len(), RUNS);
        // Committed at once, so the store may take several in one batch (`sql::attempt_batch`).
        let tasks: Vec<_> = leases
            .iter()
            .map(|l| {
                let (commit, event_id) = start(l, RunStatus::Completed, 2_010);
                let s = s.clone();
                let run = l.delivery.run_id.clone().unwrap();
                tokio::spawn(async move {
                    s.commit_attempt(commit).await.unwrap();
                    (run, event_id)
                })
            })
            .collect();
        for t in tasks {
            let (run, event_id) = t.await.unwrap();
            assert_eq!(run_event_rows(&raw, &run), 1, "{name}");
            let full = s.run_events(&run, None, 100).await.unwrap();
            let types: Vec<&str> = full.iter().map(|e| e.event_type.as_str()).collect();
            assert_eq!(
                types,
                ["run.started", "trigger.delivery.attempted", "run.completed"]
            );
            assert_eq!(full[1].event_id, event_id);
            pages_agree(&*s, &run, &full).await;
        }
        assert_eq!(
            raw.count("SELECT COUNT(*) FROM run_events"),
            RUNS as i64,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_holds_one_delivery_per_packed_event_and_webhook() {
    for (name, s, raw, _guard) in backends().await {
        subscription(&*s).await;
        for (hook, events) in [("wh_all", vec!["*"]), ("wh_end", vec!["run.completed"])] {
            s.create_webhook(
                WebhookRecord {
                    id: hook.into(),
                    url: "https://example.test/hook".into(),
                    events: events.into_iter().map(String::from).collect(),
                    tenant_id: "t".into(),
                    secret_file: "hook.secret".into(),
                    standard_secret_file: None,
                    created_at: 1_000,
                },
                SubscriptionDef {
                    id: hook.into(),
                    source: Source::Webhook,
                    connector: "webhook".into(),
                    config: json!({}),
                    failure_threshold: 0,
                },
            )
            .await
            .unwrap();
        }
        let (run, _) = started_run(&*s, "dk_1", RunStatus::Completed, 2_010).await;
        assert_eq!(run_event_rows(&raw, &run), 1, "{name}");
        let full = s.run_events(&run, None, 100).await.unwrap();
        let mut got: Vec<(String, String)> = raw
            .texts(&format!(
                "SELECT subscription_id, receipt_id FROM deliveries \
                 WHERE kind = 'outbound_webhook' AND run_id = {}",
                lit(&run)
            ))
            .into_iter()
            .map(|r| (r[0].clone(), r[1].clone()))
            .collect();
        got.sort();
        let mut want: Vec<(String, String)> = full
            .iter()
            .map(|e| ("wh_all".to_string(), e.event_id.clone()))
            .chain([("wh_end".to_string(), full[2].event_id.clone())])
            .collect();
        want.sort();
        assert_eq!(got, want, "{name}");
        // Each delivery's event reads by its id, as the outbound sender reads it.
        for (_, event_id) in &got {
            let e = s.get_run_event(&run, event_id).await.unwrap();
            assert!(full.contains(&e));
        }
    }
}
