//! Copying a SQLite store into PostgreSQL (`trigger_bridge_store::copy`): a store filled through the
//! Store API (every table holds rows) copied into a fresh test schema; the counts, a binary body and the
//! copied store at work; the refusal of a non-empty target and `force`; the schema and version checks; a
//! table the copy never heard of, with its sequence carried over. Each test skips, with a printed
//! reason, only when PostgreSQL cannot be reached and `CI` is unset.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::{AttemptFailure, AttemptReport, RunStart};
use tb_core::delivery::{AttemptDecision, AttemptOutcome, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::run::RunStatus;
use tb_core::subscription::{FailurePolicy, Source};
use trigger_bridge_store::copy::{self, CopyError, CopyOptions, CopyReport};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sql::Backend;
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

const POLICY: FailurePolicy = FailurePolicy {
    failure_window_ms: 0,
    dead_letter_after_ms: 0,
    dead_letter_min_failures: 1,
};

/// Receipts with a delivery each (plus [`UNMATCHED`] without): more than one batch at the tests'
/// batch size.
const ROUTED: usize = 230;
const UNMATCHED: usize = 20;
/// Small batches, so every table of some size takes several.
const OPTS: CopyOptions = CopyOptions {
    force: false,
    batch_rows: 100,
    batch_bytes: 1 << 20,
};

fn def(id: &str) -> SubscriptionDef {
    SubscriptionDef {
        id: id.into(),
        source: Source::Webhook,
        connector: "github".into(),
        config: json!({"secret": "env:GH"}),
        failure_threshold: 3,
    }
}

/// A body with every byte value, and `i` to tell them apart.
fn body(i: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..=255u8).collect();
    b.extend_from_slice(format!("#{i}\r\n\0").as_bytes());
    b
}

fn receipt(i: usize, routed: bool) -> NewReceipt {
    NewReceipt {
        id: new_id(IdKind::Receipt),
        // Typed columns other than their defaults, so the copy is seen to carry them.
        source: if i % 2 == 1 {
            tb_core::receipt::ReceiptSource::Queue
        } else {
            tb_core::receipt::ReceiptSource::Webhook
        },
        subscription_id: "gh".into(),
        dedup_key: format!("dk_{i}"),
        provider_event_id: format!("pe-{i}"),
        event_type: "pull_request.opened".into(),
        normalized: json!({"event": "pull_request", "n": i}),
        state: if routed {
            ReceiptState::Routed
        } else {
            ReceiptState::Unmatched
        },
        content_type: Some("application/octet-stream".into()),
        body: Bytes::from(body(i)),
        received_at: 2_000 + i as i64,
        dedup_until: 2_000 + 86_400_000,
        deliveries: if routed {
            vec![NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: if i % 2 == 1 {
                    tb_core::delivery::DeliveryKind::ApiRun
                } else {
                    tb_core::delivery::DeliveryKind::Binding
                },
                binding_id: "b1".into(),
                action: "start_run".into(),
                workflow_id: Some("noop".into()),
                run_id: Some(new_id(IdKind::Run)),
                inputs: json!({"pr": i}),
                params: None,
                state: DeliveryState::Pending,
                dead_letter_reason: None,
            }]
        } else {
            vec![]
        },
        capability: None,
        lease: None,
        trace_context: None,
    }
}

fn commit(lease: &Lease, outcome: AttemptOutcome, next: DeliveryState, now: i64) -> AttemptCommit {
    let decision = match (outcome, next) {
        (AttemptOutcome::Delivered, _) => AttemptDecision::Delivered,
        (_, DeliveryState::DeadLettered) => AttemptDecision::DeadLetter,
        _ => AttemptDecision::Retry { delay_ms: 1_000 },
    };
    AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: lease.token.clone(),
                attempt: lease.delivery.attempts + 1,
            },
            event_id: new_id(IdKind::Event),
            decision,
            failure: (outcome != AttemptOutcome::Delivered).then(|| AttemptFailure {
                error_class: "http_500".to_string(),
                message: None,
                permanent: false,
            }),
            started_at: now,
            duration_ms: 4,
            run: None,
            effect: None,
            failure_policy: POLICY,
        },
        effect: None,
        now,
    }
}

/// The run a delivered attempt starts, as the worker reports it.
fn run_start(r: NewRun) -> RunStart {
    RunStart {
        id: r.id,
        workflow_id: r.workflow_id,
        inputs: r.inputs,
        status: r.status,
        dead_letter: r.dead_letter,
        session: false,
    }
}

fn signal(id: &str, name: &str, data: tb_core::signal::DataPlacement) -> NewSignal {
    NewSignal {
        signal_id: id.into(),
        name: name.into(),
        source: tb_core::signal::SignalSource {
            kind: tb_core::signal::SourceKind::Api,
            receipt_id: None,
            actor_id: None,
        },
        data,
        wake: false,
        delivery_id: None,
    }
}

/// What [`fill`] wrote that the tests look for.
struct Filled {
    /// A receipt with its binary body.
    receipt: (String, Vec<u8>),
    /// The session run.
    session: String,
    /// Deliveries still pending (due at 2 000 ms).
    pending: Vec<String>,
}

/// Fills every table of the store in `dir` through the Store API.
async fn fill(dir: &Path) -> Filled {
    let s = SqliteStore::open_dir(dir).expect("open sqlite");
    s.upsert_subscription(def("gh"), 1_000).await.unwrap();
    // A schedule's cursor, moved once so its version is 2.
    let cursor = tb_core::schedule::plan::Cursor {
        last_nominal_ms: 60_000,
        missed_total: 3,
        buffered_ms: Some(120_000),
        last_receipt: Some("rcpt_tick".into()),
    };
    assert!(s
        .put_schedule_cursor("nightly", cursor.clone(), None, 1_000)
        .await
        .unwrap());
    assert!(s
        .put_schedule_cursor("nightly", cursor, Some(1), 1_001)
        .await
        .unwrap());
    // A triggers.v2 service with a heartbeat.
    s.register_service("svc", "1.0", json!({"service": "svc"}), "sha256:00", 1_000)
        .await
        .unwrap();
    assert!(s
        .service_heartbeat("svc", "2026-12-01T00:00:00Z", "sha256:00", false, 1_001)
        .await
        .unwrap());
    // Audit entries and a console login.
    for i in 0..3 {
        let e = tb_core::audit::NewEntry {
            at: 1_000 + i,
            actor: "ops".into(),
            action: "subscription.pause".into(),
            target: "gh".into(),
            outcome: "ok".into(),
            detail: "{}".into(),
        };
        s.append_audit(e, Some(tb_core::audit::Key::from_bytes([5; 32])))
            .await
            .unwrap();
    }
    s.create_console_login(trigger_bridge_store::ConsoleLogin {
        token_sha256: "ab".repeat(32),
        key_name: "ops".into(),
        key_sha256: "ef".repeat(32),
        csrf: "cd".repeat(16),
        created_at: 1_000,
        expires_at: i64::MAX / 2,
    })
    .await
    .unwrap();
    let mut first = None;
    for i in 0..ROUTED + UNMATCHED {
        let r = receipt(i, i < ROUTED);
        first.get_or_insert((r.id.clone(), r.body.to_vec()));
        s.commit_receipt(r).await.unwrap();
    }
    // Runs with events (delivered), a retry, and a coalescing session start.
    let leases = s.lease_due("w", 3_000, 60_000, 6).await.unwrap();
    for (n, lease) in leases[..4].iter().enumerate() {
        let mut c = commit(
            lease,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            3_100,
        );
        c.report.run = Some(run_start(NewRun {
            id: lease.delivery.run_id.clone().unwrap(),
            workflow_id: "noop".into(),
            inputs: json!({"n": n}),
            status: RunStatus::Completed,
            dead_letter: None,
            session: None,
        }));
        s.commit_attempt(c).await.unwrap();
    }
    s.commit_attempt(commit(
        &leases[4],
        AttemptOutcome::Retrying,
        DeliveryState::Retrying,
        3_200,
    ))
    .await
    .unwrap();
    let session = leases[5].delivery.run_id.clone().unwrap();
    let mut c = commit(
        &leases[5],
        AttemptOutcome::Delivered,
        DeliveryState::Delivered,
        3_300,
    );
    c.effect = Some(Effect::StartSession {
        run: NewRun {
            id: session.clone(),
            workflow_id: "pr-session".into(),
            inputs: json!({}),
            status: RunStatus::Running,
            dead_letter: None,
            session: Some((
                json!({"system": "start"}),
                tb_core::signal::MailboxPolicy::default(),
            )),
        },
        coalesce: Some(Box::new(Coalesce {
            workflow_id: "pr-session".into(),
            key: "o/r#1".into(),
            on_existing: tb_core::binding::OnExisting::Signal,
            signal: None,
            prompt: None,
        })),
    });
    s.commit_attempt(c).await.unwrap();
    // The session: signals (one with its payload by reference), a wait, turns.
    use tb_core::signal::DataPlacement;
    s.raise_signal(&session, signal("s1", "ci", DataPlacement::None), 4_000)
        .await
        .unwrap();
    s.raise_signal(
        &session,
        signal("s2", "big", DataPlacement::Reference(body(7))),
        4_001,
    )
    .await
    .unwrap();
    s.create_wait(
        &session,
        "wait_1",
        tb_core::wait::WaitSpec {
            kind: tb_core::wait::WaitKind::Signal,
            names: vec!["deploy".into()],
            timeout_ms: Some(60_000),
            user_input: false,
            reason: "copy test".into(),
        },
        4_100,
    )
    .await
    .unwrap();
    s.enqueue_prompt(
        &session,
        NewPrompt {
            text: "hi".into(),
            variables: json!({"v": 1}),
            from: "user".into(),
            delivery_id: None,
        },
        4_200,
    )
    .await
    .unwrap();
    s.claim_turn(&session, 60_000, 4_300).await.unwrap();
    // Idempotency keys, a webhook, a capability, a revoked binding, duplicates.
    s.idempotency_claim("p POST /x", "k1", "d1", 5_000, 60_000)
        .await
        .unwrap();
    s.idempotency_finish(
        "p POST /x",
        "k1",
        Some(StoredReply {
            status: 201,
            content_type: Some("application/json".into()),
            body: vec![0, 159, 146, 150, 255],
        }),
        5_001,
    )
    .await
    .unwrap();
    // A webhook whose secret is sealed in the store (the change log gets its row too).
    s.create_webhook_sealed(
        WebhookRecord {
            id: "wh_1".into(),
            url: "https://example.com/hook".into(),
            events: vec!["run.completed".into()],
            tenant_id: "t1".into(),
            secret_file: "store:whs_1".into(),
            standard_secret_file: None,
            created_at: 5_100,
        },
        def("wh_1"),
        vec![("whs_1".into(), vec![1, 0, 255, 7, 42])],
    )
    .await
    .unwrap();
    s.create_capability(
        CapabilityRecord {
            id: "sgep_1".into(),
            run_id: session.clone(),
            signal: "approve".into(),
            label: Some("approve".into()),
            wake: true,
            hmac_file: None,
            hmac: false,
            created_by: Some("ops".into()),
            created_at: 5_200,
            expires_at: 9_000_000,
            max_uses: 3,
            use_count: 0,
            revoked_at: None,
        },
        "hash-1".into(),
    )
    .await
    .unwrap();
    s.revoke_binding("b-old", Some("ops".into()), 5_300)
        .await
        .unwrap();
    // Ingress counts and a quarantine.
    let totals = s
        .add_ingress_counts(
            vec![trigger_bridge_store::IngressCount {
                minute: 1,
                scope: "subscription".into(),
                key: "gh".into(),
                outcome: "signature_invalid".into(),
                n: 7,
            }],
            None,
        )
        .await
        .unwrap();
    assert_eq!(totals, vec![7]);
    s.quarantine_subscription(trigger_bridge_store::QuarantineRecord {
        subscription_id: "gh".into(),
        since: 5_400,
        reason: "flood".into(),
        quarantined_by: Some("ops".into()),
    })
    .await
    .unwrap();
    let pending: Vec<String> = s
        .list_deliveries(ListQuery {
            limit: 1_000,
            state: Some("pending".into()),
            ..ListQuery::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    s.close().await;
    Filled {
        receipt: first.unwrap(),
        session,
        pending,
    }
}

fn db_file(dir: &Path) -> PathBuf {
    dir.join("trigger-bridge.db")
}

async fn target(db: &TestDatabase) -> PgStore {
    PgStore::connect(db.url(), PoolOptions::default())
        .await
        .expect("open postgres")
}

/// Copies with [`OPTS`] (and `force`), collecting every progress report as `(table, done, total)`.
async fn run_copy(
    source: &SqliteStore,
    target: &PgStore,
    force: bool,
) -> (Result<CopyReport, CopyError>, Vec<(String, u64, u64)>) {
    let mut seen = Vec::new();
    let opts = CopyOptions { force, ..OPTS };
    let r = copy::copy(source, target, opts, &mut |p| {
        seen.push((p.table.to_string(), p.done, p.total))
    })
    .await;
    (r, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filled_store_is_copied_whole_and_the_copy_works() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let filled = fill(dir.path()).await;
    let source = copy::open_source(&db_file(dir.path())).unwrap();
    let target = target(&db).await;

    let (report, progress) = run_copy(&source, &target, false).await;
    let report = report.unwrap();
    assert!(!report.truncated);
    assert!(report.mismatches().is_empty(), "{:?}", report.tables);
    let count = |t: &str| {
        report
            .tables
            .iter()
            .find(|c| c.table == t)
            .unwrap_or_else(|| panic!("table {t} copied"))
            .target
    };
    // Every table of the schema holds rows, and the same number on both sides.
    for t in &report.tables {
        assert!(
            t.source > 0,
            "table {} is empty in the source: a new table? make fill() write to it",
            t.table
        );
    }
    assert_eq!(count("receipts"), (ROUTED + UNMATCHED) as u64);
    // Each receipt's body travels in its row, counted apart from the rows.
    assert_eq!(
        report.values,
        [copy::TableCount {
            table: "receipts.body".into(),
            source: (ROUTED + UNMATCHED) as u64,
            target: (ROUTED + UNMATCHED) as u64,
        }]
    );
    assert_eq!(count("deliveries"), ROUTED as u64);
    assert_eq!(count("attempts"), 6);
    assert_eq!(count("runs"), 5);
    assert_eq!(count("subscriptions"), 2);
    assert_eq!(count("signals"), 2);
    assert_eq!(count("signal_payloads"), 1);
    assert_eq!(count("coalesce_keys"), 1);
    assert_eq!(count("idempotency_keys"), 1);
    assert_eq!(count("webhooks"), 1);
    assert_eq!(count("capabilities"), 1);
    assert_eq!(count("binding_revocations"), 1);
    assert_eq!(count("ingress_counts"), 1);
    assert_eq!(count("subscription_quarantines"), 1);
    assert_eq!(count("audit_log"), 3);
    assert_eq!(count("audit_head"), 1);
    // The audit chain survives the copy: the target's head is the source's, and appends go on from it.
    let key = tb_core::audit::Key::from_bytes([5; 32]);
    let mut v = tb_core::audit::Verifier::new(Some(key.clone()), None);
    for e in target
        .audit_entries(trigger_bridge_store::AuditQuery {
            after_seq: Some(0),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
    {
        v.feed(&e);
    }
    let head = target.audit_head().await.unwrap();
    assert_eq!(v.finish(head.seq, &head.hash, head.max_seq), Ok(3));
    let head_hash = head.hash;
    let next = target
        .append_audit(
            tb_core::audit::NewEntry {
                at: 2_000,
                actor: "ops".into(),
                action: "subscription.resume".into(),
                target: "gh".into(),
                outcome: "ok".into(),
                detail: "{}".into(),
            },
            Some(key),
        )
        .await
        .unwrap()
        .entry;
    assert_eq!((next.seq, next.prev_hash), (4, head_hash));
    assert_eq!(
        report.rows(),
        report.tables.iter().map(|t| t.source).sum::<u64>()
    );
    assert!(report.sequences.is_empty(), "the schema has no sequence");

    // Progress: per table, from 0 to its total, rising, in batches of at most 100 rows.
    for t in &report.tables {
        let mine: Vec<_> = progress.iter().filter(|p| p.0 == t.table).collect();
        assert_eq!((mine[0].1, mine[0].2), (0, t.source), "{}", t.table);
        assert_eq!(mine.last().unwrap().1, t.source, "{}", t.table);
        for w in mine.windows(2) {
            assert!(w[1].1 > w[0].1 && w[1].1 - w[0].1 <= 100, "{w:?}");
        }
    }
    assert!(progress.iter().filter(|p| p.0 == "receipts").count() >= 4);

    // Binary bodies byte-identical, records equal.
    let (rid, bytes) = &filled.receipt;
    assert_eq!(&target.get_body(rid).await.unwrap()[..], &bytes[..]);
    assert_eq!(
        target.get_receipt(rid).await.unwrap(),
        source.get_receipt(rid).await.unwrap()
    );
    let q = ListQuery {
        limit: 100,
        ..ListQuery::default()
    };
    // Every receipt's `source` and delivery's `kind` (the columns of SQLite 0011 / PostgreSQL 0005).
    let all = ListQuery {
        limit: 1_000,
        ..ListQuery::default()
    };
    let receipts = target.list_receipts(all.clone()).await.unwrap();
    assert!(receipts
        .iter()
        .any(|r| r.source == tb_core::receipt::ReceiptSource::Queue));
    assert_eq!(receipts, source.list_receipts(all.clone()).await.unwrap());
    let deliveries = target.list_deliveries(all.clone()).await.unwrap();
    assert!(deliveries
        .iter()
        .any(|d| d.kind == tb_core::delivery::DeliveryKind::ApiRun));
    assert_eq!(deliveries, source.list_deliveries(all).await.unwrap());
    let runs = target.list_runs(q.clone()).await.unwrap();
    assert_eq!(runs.len(), 5);
    assert_eq!(runs, source.list_runs(q).await.unwrap());
    assert_eq!(
        target.run_events(&filled.session, None, 100).await.unwrap(),
        source.run_events(&filled.session, None, 100).await.unwrap()
    );
    let page = target
        .list_signals(&filled.session, None, 10)
        .await
        .unwrap();
    assert_eq!(page.signals.len(), 2);
    let reference = page
        .signals
        .iter()
        .find_map(|s| s.signal["payloadRef"].as_str().map(str::to_string));
    let payload = target
        .signal_payload(&filled.session, &reference.expect("a payload by reference"))
        .await
        .unwrap();
    assert_eq!(&payload[..], &body(7)[..]);
    assert_eq!(
        target.list_turns(&filled.session).await.unwrap(),
        source.list_turns(&filled.session).await.unwrap()
    );
    assert_eq!(target.list_webhooks().await.unwrap().len(), 1);
    assert!(target
        .capability_by_hash("hash-1", 6_000)
        .await
        .unwrap()
        .is_some());
    assert!(matches!(
        target
            .idempotency_claim("p POST /x", "k1", "d1", 6_000, 60_000)
            .await
            .unwrap(),
        IdempotencyClaim::Replay(r) if r.body == vec![0, 159, 146, 150, 255]
    ));

    // The copy works: a due delivery is leased on PostgreSQL and its attempt commits.
    let leased = target.lease_due("pg-w", 10_000, 60_000, 1).await.unwrap();
    assert_eq!(leased.len(), 1);
    assert!(
        filled.pending.contains(&leased[0].delivery.id),
        "a delivery pending in SQLite"
    );
    target
        .commit_attempt(commit(
            &leased[0],
            AttemptOutcome::Retrying,
            DeliveryState::Retrying,
            10_100,
        ))
        .await
        .unwrap();
    assert_eq!(
        target.attempts(&leased[0].delivery.id).await.unwrap().len(),
        1
    );
    source.close().await;
    target.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_empty_target_is_refused_and_force_replaces_it() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path()).await;
    let source = copy::open_source(&db_file(dir.path())).unwrap();
    let target = target(&db).await;
    run_copy(&source, &target, false).await.0.unwrap();

    // Again, without force: refused, naming the first non-empty table (by name), nothing written.
    let (again, progress) = run_copy(&source, &target, false).await;
    match again {
        Err(CopyError::TargetNotEmpty(t)) => assert_eq!(t, "attempts"),
        other => panic!("expected TargetNotEmpty, got {other:?}"),
    }
    assert!(progress.is_empty());
    let e = CopyError::TargetNotEmpty("attempts".into()).to_string();
    assert!(
        e.contains("table attempts has rows") && e.contains("--force"),
        "{e}"
    );

    // A row only the target has, then force: the target is emptied first and ends an exact copy.
    target
        .upsert_subscription(def("pg-only"), 9_000)
        .await
        .unwrap();
    let (forced, _) = run_copy(&source, &target, true).await;
    let forced = forced.unwrap();
    assert!(forced.truncated);
    assert!(forced.mismatches().is_empty(), "{:?}", forced.tables);
    assert!(matches!(
        target.get_subscription("pg-only").await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(target.list_subscriptions().await.unwrap().len(), 2);
    // The migrations table is kept: the target is still at the newest version.
    let version: i64 = target
        .backend()
        .read(|c| {
            c.value("SELECT MAX(version) FROM schema_migrations", p![])
                .map(|v: Option<i64>| v.unwrap_or(0))
        })
        .await
        .unwrap();
    assert_eq!(
        version,
        trigger_bridge_store::postgres::MIGRATIONS.last().unwrap().0
    );

    // Verification sees a row lost after the copy.
    target
        .backend()
        .write(|c| c.exec("DELETE FROM turns WHERE kind = 'prompt'", p![]))
        .await
        .unwrap();
    let tables = copy::plan(&source, &target).await.unwrap();
    let counts = copy::verify(&source, &target, &tables).await.unwrap();
    let bad: Vec<_> = counts.iter().filter(|c| !c.matches()).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(
        (bad[0].table.as_str(), bad[0].source, bad[0].target),
        ("turns", 2, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemas_that_differ_are_refused_before_anything_is_written() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path()).await;
    let source = copy::open_source(&db_file(dir.path())).unwrap();
    let target = target(&db).await;
    target
        .backend()
        .write(|c| {
            c.exec("ALTER TABLE runs ADD COLUMN tenant TEXT", p![])?;
            c.exec("CREATE TABLE pg_extra (id TEXT PRIMARY KEY)", p![])
        })
        .await
        .unwrap();
    match run_copy(&source, &target, true).await.0 {
        Err(CopyError::SchemaMismatch(diffs)) => {
            assert_eq!(diffs.len(), 2, "{diffs:?}");
            assert!(
                diffs[0].starts_with("table runs: source columns ("),
                "{diffs:?}"
            );
            assert!(diffs[0].ends_with(", next_turn_seq, tenant)"), "{diffs:?}");
            assert_eq!(diffs[1], "table pg_extra is in the target only");
        }
        other => panic!("expected SchemaMismatch, got {other:?}"),
    }
    let runs: i64 = target
        .backend()
        .read(|c| {
            c.value("SELECT COUNT(*) FROM runs", p![])
                .map(|v| v.unwrap_or(0))
        })
        .await
        .unwrap();
    assert_eq!(runs, 0, "nothing copied");
}

#[test]
fn a_source_at_another_schema_version_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = db_file(dir.path());
    {
        let conn = rusqlite::Connection::open(&file).unwrap();
        trigger_bridge_store::sqlite::migrate(&conn).unwrap();
        conn.execute_batch("PRAGMA user_version = 6").unwrap();
    }
    match copy::open_source(&file) {
        Err(CopyError::Version {
            side,
            found,
            newest,
            ..
        }) => assert_eq!(
            (side, found, newest),
            ("source", 6, trigger_bridge_store::sqlite::SCHEMA_VERSION)
        ),
        other => panic!("expected Version, got {:?}", other.map(|_| ())),
    }
    assert_eq!(copy::source_file_version(&file).unwrap(), 6, "not migrated");
    assert!(matches!(
        copy::open_source(&dir.path().join("nothing.db")),
        Err(CopyError::NoSource(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_added_by_a_migration_is_copied_and_its_sequence_continues() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path()).await;
    let file = db_file(dir.path());
    {
        // A table this code never heard of, with an AUTOINCREMENT key whose high-water mark (4) is
        // above the largest key left (3), and one without a primary key.
        let conn = rusqlite::Connection::open(&file).unwrap();
        conn.execute_batch(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, note BLOB NOT NULL); \
             INSERT INTO notes (note) VALUES (x'00ff'), (x'01'), (x'02'), (x'03'); \
             DELETE FROM notes WHERE id = 4; \
             CREATE TABLE tags (name TEXT NOT NULL, n INTEGER); \
             INSERT INTO tags VALUES ('a', 1), ('a', 1), ('b', NULL);",
        )
        .unwrap();
    }
    let source = copy::open_source(&file).unwrap();
    let target = target(&db).await;
    target
        .backend()
        .write(|c| {
            c.exec(
                "CREATE TABLE notes (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 note BYTEA NOT NULL)",
                p![],
            )?;
            c.exec("CREATE TABLE tags (name TEXT NOT NULL, n BIGINT)", p![])
        })
        .await
        .unwrap();
    let report = run_copy(&source, &target, false).await.0.unwrap();
    assert!(report.mismatches().is_empty(), "{:?}", report.tables);
    let notes = report.tables.iter().find(|t| t.table == "notes").unwrap();
    assert_eq!((notes.source, notes.target), (3, 3));
    let tags = report.tables.iter().find(|t| t.table == "tags").unwrap();
    assert_eq!((tags.source, tags.target), (3, 3), "duplicate rows kept");
    assert_eq!(report.sequences.len(), 1);
    assert_eq!(report.sequences[0].1, 5, "past SQLite's high-water mark");
    let (next, first): (i64, Vec<u8>) = target
        .backend()
        .write(|c| {
            let id: i64 = c
                .value(
                    "INSERT INTO notes (note) VALUES (?1) RETURNING id",
                    p![b"new".to_vec()],
                )?
                .unwrap();
            let first: Vec<u8> = c
                .value("SELECT note FROM notes WHERE id = 1", p![])?
                .unwrap();
            Ok((id, first))
        })
        .await
        .unwrap();
    assert_eq!(next, 5, "no id clash with the copied keys");
    assert_eq!(first, vec![0x00, 0xff]);
}
