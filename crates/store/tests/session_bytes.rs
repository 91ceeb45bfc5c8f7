//! What an idle session stores, on every backend: the rows an API start and one armed
//! wait leave, and the bytes of their text and blob values, against a budget. The pages these rows
//! take (with their indexes) are measured by `bench/sessions_disk.py`; this test fails as soon as a
//! row comes back (a body copy, a subscription event of the pseudo-subscription), a value is copied
//! again (the session configuration into the start turn, run-row fields into event payloads) or the
//! readers stop showing what was built.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use tb_core::attempt::AttemptReport;
use tb_core::delivery::{AttemptDecision, DeliveryState};
use tb_core::ids::{new_id, run_id_for_delivery, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::run::RunStatus;
use tb_core::subscription::FailurePolicy;
use tb_core::wait::{WaitKind, WaitSpec};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{self as pg, PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

/// Sessions started per backend.
const SESSIONS: usize = 3;

/// Budget of one idle session's text and blob values, all session tables together (bytes). Measured
/// at this version: 1 546 on SQLite and PostgreSQL alike (run events 688, deliveries 180, runs 178,
/// waits 168, receipts 135, turns 116, attempts 81); the start turn alone carried about 360 more while it
/// copied the configuration and its system line.
const VALUE_BUDGET: u64 = 1_600;

/// The quickstart's `pr-session` configuration (examples/quickstart.toml).
fn config() -> Value {
    json!({"agent": "pr-reviewer", "budget": {"turns": 50}, "model": "approved-model",
           "namespace": "platform", "repository_access": "read", "tools": ["git", "ci-status"]})
}

/// Value bytes per table, summed over every row: SQLite `length(CAST(col AS BLOB))`, PostgreSQL
/// `octet_length`, of each TEXT / BLOB (bytea) column.
type Measure = Box<dyn Fn(&str) -> u64 + Send>;

/// A store, how to measure it, and what keeps its storage alive (a temp dir, a test schema).
type Backend = (Arc<dyn Store>, Measure, Box<dyn std::any::Any + Send>);

const TABLES: &[&str] = &[
    "receipts",
    "deliveries",
    "attempts",
    "runs",
    "run_events",
    "subscription_events",
    "turns",
    "waits",
];

async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let file = dir.path().join("trigger-bridge.db");
    let sqlite: Measure = Box::new(move |table| {
        let c = rusqlite::Connection::open(&file).unwrap();
        let cols: Vec<String> = c
            .prepare("SELECT name FROM pragma_table_info(?1) WHERE type IN ('TEXT', 'BLOB')")
            .unwrap()
            .query_map([table], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let sum: Vec<String> = cols
            .iter()
            .map(|c| format!("COALESCE(length(CAST(\"{c}\" AS BLOB)), 0)"))
            .collect();
        c.query_row(
            &format!("SELECT COALESCE(SUM({}), 0) FROM {table}", sum.join(" + ")),
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap() as u64
    });
    let mut out: Vec<Backend> = vec![(Arc::new(s), sqlite, Box::new(dir))];
    if let Some(db) = TestDatabase::create() {
        let store = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        let config = db.config();
        let measure: Measure = Box::new(move |table| {
            let table = table.to_string();
            let config = config.clone();
            // The postgres client runs its own runtime: keep it off the test's.
            std::thread::spawn(move || {
                let mut c = pg::connect(&config).unwrap();
                let cols: Vec<String> = c
                    .query(
                        "SELECT column_name::TEXT FROM information_schema.columns \
                         WHERE table_schema = current_schema() AND table_name = $1 \
                         AND data_type IN ('text', 'bytea')",
                        &[&table],
                    )
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                let sum: Vec<String> = cols
                    .iter()
                    .map(|c| format!("COALESCE(octet_length(\"{c}\"), 0)"))
                    .collect();
                c.query_one(
                    &format!(
                        "SELECT COALESCE(SUM({}), 0)::BIGINT FROM {table}",
                        sum.join(" + ")
                    ),
                    &[],
                )
                .unwrap()
                .get::<_, i64>(0) as u64
            })
            .join()
            .unwrap()
        });
        out.push((Arc::new(store), measure, Box::new(db)));
    }
    out
}

/// Starts a session the way `POST /v1/runs` does (`engine::runs::start`: a receipt of the `api`
/// pseudo-subscription, which has no subscription row, with one `start_run` delivery; its attempt
/// starts the session), then arms a signal wait with a deadline a day away, as
/// `bench/sessions_disk.py` does. Returns the run id.
async fn idle_session(s: &dyn Store, now: i64) -> String {
    let receipt_id = new_id(IdKind::Receipt);
    let delivery_id = new_id(IdKind::Delivery);
    let run_id = run_id_for_delivery(&delivery_id);
    s.commit_receipt(NewReceipt {
        source: tb_core::receipt::ReceiptSource::Api,
        id: receipt_id.clone(),
        subscription_id: "api".into(),
        dedup_key: tb_core::dedup::dedup_key("api", &receipt_id),
        provider_event_id: receipt_id.clone(),
        event_type: "run.requested".into(),
        normalized: json!({}),
        state: ReceiptState::Routed,
        content_type: None,
        body: Bytes::new(),
        received_at: now,
        dedup_until: now,
        deliveries: vec![NewDelivery {
            id: delivery_id,
            kind: tb_core::delivery::DeliveryKind::ApiRun,
            binding_id: "api".into(),
            action: "start_run".into(),
            workflow_id: Some("pr-session".into()),
            run_id: Some(run_id.clone()),
            inputs: json!({}),
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
    let lease = s.lease_due("w", now, 60_000, 1).await.unwrap().remove(0);
    let run = NewRun {
        id: run_id.clone(),
        workflow_id: "pr-session".into(),
        inputs: json!({}),
        status: RunStatus::Running,
        dead_letter: None,
        session: Some((config(), tb_core::signal::MailboxPolicy::default())),
    };
    s.commit_attempt(AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: lease.token.clone(),
                attempt: 1,
            },
            event_id: new_id(IdKind::Event),
            decision: AttemptDecision::Delivered,
            failure: None,
            started_at: now,
            duration_ms: 0,
            run: None,
            effect: None,
            failure_policy: FailurePolicy::default(),
        },
        effect: Some(Effect::StartSession {
            run,
            coalesce: None,
        }),
        now,
    })
    .await
    .unwrap();
    let spec = WaitSpec {
        kind: WaitKind::Signal,
        names: vec!["ci.done".into()],
        timeout_ms: Some(86_400_000),
        user_input: false,
        reason: "ci".into(),
    };
    s.create_wait(&run_id, &new_id(IdKind::Wait), spec, now + 40)
        .await
        .unwrap();
    run_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_stays_within_its_byte_budget_and_reads_back_whole() {
    for (s, measure, _guard) in backends().await {
        let empty: BTreeMap<&str, u64> = TABLES.iter().map(|t| (*t, measure(t))).collect();
        let mut runs = Vec::new();
        for i in 0..SESSIONS {
            runs.push(idle_session(&*s, 1_796_000_000_000 + i as i64 * 1_000).await);
        }
        let grown: BTreeMap<&str, u64> = TABLES
            .iter()
            .map(|t| (*t, (measure(t) - empty[t]) / SESSIONS as u64))
            .collect();
        let total: u64 = grown.values().sum();
        println!("value bytes per idle session: {total} {grown:?}");
        // Rows that are no longer written at all.
        assert_eq!(
            grown["subscription_events"], 0,
            "no pseudo-subscription event"
        );
        assert!(total <= VALUE_BUDGET, "{total} > {VALUE_BUDGET}: {grown:?}");
        // The start turn stores a reference, not a copy of the configuration.
        assert!(grown["turns"] < 150, "{grown:?}");

        // Readers still see what was built.
        let run = &runs[0];
        let turns = s.list_turns(run).await.unwrap();
        assert_eq!(turns.len(), 1);
        assert_eq!(
            turns[0].content,
            tb_core::turn::start_content("pr-session", &config(), &json!({}))
        );
        let events = s.run_events(run, None, 100).await.unwrap();
        let shapes: Vec<(&str, Value)> = events
            .iter()
            .map(|e| (e.event_type.as_str(), e.payload.clone()))
            .collect();
        assert_eq!(
            shapes[0],
            (
                "run.started",
                json!({"workflowId": "pr-session", "inputs": {}})
            )
        );
        assert_eq!(shapes[1].0, "trigger.delivery.attempted");
        assert_eq!(shapes[1].1["runId"], json!(run));
        assert_eq!(shapes[1].1["outcome"], "delivered");
        assert_eq!(shapes[1].1["subscriptionId"], "api");
        assert_eq!(shapes[2].0, "tb.turn.queued");
        assert_eq!(shapes[2].1["turnId"], json!(turns[0].id));
        assert_eq!(shapes[3].0, "tb.wait.started");
        assert_eq!(events.len(), 4);
        let by_id = s.get_run_event(run, &events[1].event_id).await.unwrap();
        assert_eq!(by_id.payload, events[1].payload);
        assert!(matches!(
            s.get_run_event(&runs[1], &events[1].event_id).await,
            Err(StoreError::NotFound { .. })
        ));
        // No body copy of an API start: the receipt's body is empty (its column NULL, no bytes
        // above) and reads as empty.
        let receipt = s.get_run(run).await.unwrap().receipt_id.unwrap();
        assert_eq!(s.get_receipt(&receipt).await.unwrap().body_bytes, 0);
        assert!(s.get_body(&receipt).await.unwrap().is_empty());
    }
}

/// Each index costs bytes on every row: the tables an idle session writes carry only the indexes a
/// query of `crates/store/src/sql/` uses (or a constraint needs). SQLite names its key indexes
/// `sqlite_autoindex_*`; `attempts` and `run_events` are WITHOUT ROWID, so their key is the table.
#[test]
fn the_session_tables_carry_only_the_indexes_a_query_uses() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    trigger_bridge_store::sqlite::migrate(&conn).unwrap();
    let got: Vec<(String, String)> = conn
        .prepare(
            "SELECT tbl_name, name FROM sqlite_master WHERE type = 'index' AND tbl_name IN \
             ('receipts', 'deliveries', 'attempts', 'runs', 'run_events', 'turns', 'waits') \
             ORDER BY 1, 2",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want = [
        ("deliveries", "deliveries_by_state"), // lists by state, newest first
        ("deliveries", "deliveries_due"),      // the lease pick
        ("deliveries", "sqlite_autoindex_deliveries_1"), // id key
        ("deliveries", "sqlite_autoindex_deliveries_2"), // UNIQUE (receipt_id, binding_id)
        ("receipts", "receipts_body_held"),    // the sweeper's walk of held bodies
        ("receipts", "receipts_dedup"),        // one live receipt per dedup key
        ("receipts", "sqlite_autoindex_receipts_1"), // id key
        ("runs", "sqlite_autoindex_runs_1"),   // id key
        ("runs", "sqlite_autoindex_runs_2"),   // UNIQUE delivery_id
        ("turns", "sqlite_autoindex_turns_1"), // id key
        ("turns", "sqlite_autoindex_turns_2"), // UNIQUE (run_id, seq)
        ("turns", "turns_open"),               // the head turn of a claim
        ("waits", "sqlite_autoindex_waits_1"), // id key
        ("waits", "waits_due"),                // the timer loop
        ("waits", "waits_one_armed"),          // one armed wait per run
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(t, i)| (t.to_string(), i.to_string()))
        .collect();
    assert_eq!(got, want);
}
