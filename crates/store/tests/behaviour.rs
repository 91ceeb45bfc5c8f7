//! The shared Store behaviour suite (DESIGN §12): every backend must pass every case here.
//! Each case takes a fresh `Arc<dyn Store>`; `backends()` lists the backends to run.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::{AttemptFailure, AttemptReport, RunStart};
use tb_core::delivery::{AttemptDecision, AttemptOutcome, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::run::RunStatus;
use tb_core::subscription::{FailurePolicy, Source, SubscriptionInput, SubscriptionState};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

/// What keeps a backend's storage alive for the length of a case (a temp dir, a test schema).
type Guard = Box<dyn std::any::Any + Send>;

/// Fresh stores of every backend available here: SQLite in a temp dir, and PostgreSQL in a schema of
/// its own (dropped with the guard; skipped with a printed reason only when the server is unreachable
/// and `CI` is unset).
async fn backends() -> Vec<(Arc<dyn Store>, Guard)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let mut out: Vec<(Arc<dyn Store>, Guard)> = vec![(Arc::new(s), Box::new(dir))];
    if let Some(db) = TestDatabase::create() {
        let pg = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        out.push((Arc::new(pg), Box::new(db)));
    }
    out
}

async fn sub(store: &dyn Store, id: &str, threshold: u32) {
    store
        .upsert_subscription(
            SubscriptionDef {
                id: id.into(),
                source: Source::Webhook,
                connector: "github".into(),
                config: json!({}),
                failure_threshold: threshold,
            },
            1_000,
        )
        .await
        .unwrap();
}

fn receipt(sub: &str, key: &str, body: &'static [u8], bindings: &[&str]) -> NewReceipt {
    NewReceipt {
        id: new_id(IdKind::Receipt),
        source: tb_core::receipt::ReceiptSource::Webhook,
        subscription_id: sub.into(),
        dedup_key: key.into(),
        provider_event_id: format!("pe-{key}"),
        event_type: "pull_request.opened".into(),
        normalized: json!({"event":"pull_request","action":"opened"}),
        state: if bindings.is_empty() {
            ReceiptState::Unmatched
        } else {
            ReceiptState::Routed
        },
        content_type: Some("application/json".into()),
        body: Bytes::from_static(body),
        received_at: 2_000,
        dedup_until: 2_000 + 86_400_000,
        deliveries: bindings
            .iter()
            .map(|b| NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: tb_core::delivery::DeliveryKind::Binding,
                binding_id: b.to_string(),
                action: "start_run".into(),
                workflow_id: Some("noop".into()),
                run_id: Some(new_id(IdKind::Run)),
                inputs: json!({"pr": 1}),
                params: None,
                state: DeliveryState::Pending,
                dead_letter_reason: None,
            })
            .collect(),
        capability: None,
        lease: None,
        trace_context: None,
    }
}

fn commit_for(
    lease: &Lease,
    outcome: AttemptOutcome,
    next: DeliveryState,
    run: Option<NewRun>,
    now: i64,
) -> AttemptCommit {
    let decision = match (outcome, next) {
        (AttemptOutcome::Delivered, _) => AttemptDecision::Delivered,
        (_, DeliveryState::DeadLettered) => AttemptDecision::DeadLetter,
        _ => AttemptDecision::Retry { delay_ms: 0 },
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
                message: Some("HTTP 500: db down".to_string()),
                permanent: false,
            }),
            started_at: now,
            duration_ms: 3,
            run: run.as_ref().map(|r| RunStart {
                id: r.id.clone(),
                workflow_id: r.workflow_id.clone(),
                inputs: r.inputs.clone(),
                status: r.status,
                dead_letter: r.dead_letter.clone(),
                session: false,
            }),
            effect: None,
            failure_policy: IMMEDIATE,
        },
        effect: None,
        now,
    }
}

/// A failure policy without windows: the breaker and dead-lettering judge counts only.
const IMMEDIATE: FailurePolicy = FailurePolicy {
    failure_window_ms: 0,
    dead_letter_after_ms: 0,
    dead_letter_min_failures: 1,
};

#[tokio::test]
async fn receipt_commit_dedup_and_exact_bytes() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let body: &'static [u8] = b"{ \"b\":1,\n  \"a\" : \"\\u00e9\xc3\xa9\" }  \r\n";
        let first = receipt("s", "dk_1", body, &["b1"]);
        let rid = first.id.clone();
        let run_id = first.deliveries[0].run_id.clone();
        let IngestOutcome::Accepted {
            receipt_id,
            deliveries,
            ..
        } = store.commit_receipt(first).await.unwrap()
        else {
            panic!("first commit must be accepted")
        };
        assert_eq!(receipt_id, rid);
        assert_eq!(deliveries.len(), 1);
        assert_eq!(deliveries[0].run_id, run_id);
        assert_eq!(
            &store.get_body(&rid).await.unwrap()[..],
            body,
            "stored body is byte-identical"
        );

        let again = receipt("s", "dk_1", b"other", &["b1"]);
        match store.commit_receipt(again).await.unwrap() {
            IngestOutcome::Duplicate {
                receipt_id,
                deliveries,
            } => {
                assert_eq!(receipt_id, rid);
                assert_eq!(deliveries[0].run_id, run_id);
            }
            o => panic!("expected duplicate, got {o:?}"),
        }
        assert!(matches!(
            store.find_duplicate("s", "dk_1", 3_000).await.unwrap(),
            Some(IngestOutcome::Duplicate { .. })
        ));
        assert!(store
            .find_duplicate("s", "dk_2", 3_000)
            .await
            .unwrap()
            .is_none());
        assert_eq!(
            store
                .list_receipts(ListQuery {
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().body_bytes,
            body.len() as u64
        );
    }
}

#[tokio::test]
async fn concurrent_commits_of_one_key_give_one_receipt() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let st = store.clone();
            tasks.push(tokio::spawn(async move {
                st.commit_receipt(receipt("s", "dk_same", b"{}", &["b1"]))
                    .await
                    .unwrap()
            }));
        }
        let mut accepted = 0;
        for t in tasks {
            if matches!(t.await.unwrap(), IngestOutcome::Accepted { .. }) {
                accepted += 1;
            }
        }
        assert_eq!(accepted, 1);
        let all = store
            .list_deliveries(ListQuery {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 1, "one delivery for one key");
    }
}

#[tokio::test]
async fn delivered_attempt_starts_the_run_with_causation() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let r = receipt("s", "dk_1", b"{}", &["b1"]);
        let rid = r.id.clone();
        let run_id = r.deliveries[0].run_id.clone().unwrap();
        store.commit_receipt(r).await.unwrap();
        let leases = store.lease_due("w1", 2_000, 60_000, 10).await.unwrap();
        assert_eq!(leases.len(), 1);
        assert!(
            store
                .lease_due("w2", 2_001, 60_000, 10)
                .await
                .unwrap()
                .is_empty(),
            "a live lease is exclusive"
        );
        let run = NewRun {
            id: run_id.clone(),
            workflow_id: "noop".into(),
            inputs: json!({"pr": 1}),
            status: RunStatus::Completed,
            dead_letter: None,
            session: None,
        };
        let c = commit_for(
            &leases[0],
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            Some(run),
            2_010,
        );
        let event_id = c.report.event_id.clone();
        store.commit_attempt(c).await.unwrap();

        let run = store.get_run(&run_id).await.unwrap();
        assert_eq!(run.status, RunStatus::Completed);
        assert_eq!(run.causation_id.as_deref(), Some(event_id.as_str()));
        let evs = store.run_events(&run_id, None, 100).await.unwrap();
        assert_eq!(
            evs.iter()
                .map(|e| (e.sequence, e.event_type.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (0, "run.started"),
                (1, "trigger.delivery.attempted"),
                (2, "run.completed")
            ]
        );
        assert_eq!(evs[0].causation_id.as_deref(), Some(event_id.as_str()));
        assert_eq!(
            evs[0].payload,
            json!({"workflowId": "noop", "inputs": {"pr": 1}})
        );
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Consumed
        );
        let sev = store.subscription_events("s", 100).await.unwrap();
        assert_eq!(sev.len(), 1);
        assert_eq!(sev[0].event_id, event_id);
        assert_eq!(
            sev[0].payload,
            json!({"subscriptionId":"s","dedupKey":"dk_1","attempt":1,"outcome":"delivered","runId": run_id})
        );
        assert!(
            store
                .lease_due("w1", 999_999, 60_000, 10)
                .await
                .unwrap()
                .is_empty(),
            "delivered is terminal"
        );
        assert!(matches!(
            store
                .finish_run(&run_id, RunStatus::Failed, None, 3_000)
                .await,
            Err(StoreError::Conflict(_))
        ));
    }
}

#[tokio::test]
async fn lapsed_lease_moves_on_and_the_old_holder_loses() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        store
            .commit_receipt(receipt("s", "dk_1", b"{}", &["b1"]))
            .await
            .unwrap();
        let old = store
            .lease_due("w1", 2_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert!(store
            .lease_due("w2", 2_500, 1_000, 10)
            .await
            .unwrap()
            .is_empty());
        let new = store
            .lease_due("w2", 3_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        let late = commit_for(
            &old,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            3_100,
        );
        assert!(matches!(
            store.commit_attempt(late).await,
            Err(StoreError::LeaseLost(_))
        ));
        store
            .commit_attempt(commit_for(
                &new,
                AttemptOutcome::Delivered,
                DeliveryState::Delivered,
                None,
                3_100,
            ))
            .await
            .unwrap();
        // The lapsed grant's attempt is recorded `lost` when taken over (docs/operations.md "Lost
        // attempts"), then the new holder's: one row per attempt, none from the old holder's commit.
        let recorded: Vec<(u32, AttemptOutcome)> = store
            .attempts(&new.delivery.id)
            .await
            .unwrap()
            .iter()
            .map(|a| (a.attempt, a.outcome))
            .collect();
        assert_eq!(
            recorded,
            vec![(1, AttemptOutcome::Lost), (2, AttemptOutcome::Delivered)]
        );
    }
}

#[tokio::test]
async fn exhaustion_dead_letters_and_moves_the_subscription() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 2).await;
        let r = receipt("s", "dk_1", b"{}", &["b1"]);
        let rid = r.id.clone();
        store.commit_receipt(r).await.unwrap();
        let mut now = 2_000;
        for (n, (outcome, next)) in [
            (AttemptOutcome::Retrying, DeliveryState::Retrying),
            (AttemptOutcome::Retrying, DeliveryState::Retrying),
            (AttemptOutcome::DeadLettered, DeliveryState::DeadLettered),
        ]
        .into_iter()
        .enumerate()
        {
            let lease = store
                .lease_due("w", now, 60_000, 10)
                .await
                .unwrap()
                .remove(0);
            assert_eq!(lease.delivery.attempts, n as u32);
            store
                .commit_attempt(commit_for(&lease, outcome, next, None, now))
                .await
                .unwrap();
            now += 10;
        }
        let d = store
            .list_deliveries(ListQuery {
                limit: 10,
                state: Some("dead-lettered".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].attempts, 3);
        assert_eq!(store.attempts(&d[0].id).await.unwrap().len(), 3);
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::DeadLettered
        );
        let s = store.get_subscription("s").await.unwrap();
        assert_eq!(s.state, SubscriptionState::DeadLettered);
        let changes: Vec<_> = store
            .subscription_events("s", 100)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.event_type == "trigger.subscription.state.changed")
            .map(|e| (e.payload["fromState"].clone(), e.payload["toState"].clone()))
            .collect();
        assert_eq!(
            changes,
            vec![
                (json!("active"), json!("failed")),
                (json!("failed"), json!("dead-lettered"))
            ]
        );
        assert_eq!(
            store.queue_depth().await.unwrap(),
            QueueDepth {
                pending: 0,
                retrying: 0,
                dead_lettered: 1
            }
        );
        // The bulk-replay selection, with and without each filter (every filter unset failed on
        // PostgreSQL before: an untyped `?N IS NULL`).
        let select = |from: Option<i64>, to: Option<i64>, class: Option<&str>| DeadLetterSelect {
            subscription_id: "s".into(),
            from,
            to,
            error_class: class.map(str::to_string),
            not_before: 0,
            limit: 10,
        };
        let all = store
            .dead_letter_selection(select(None, None, None))
            .await
            .unwrap();
        assert_eq!(
            (all.count, all.delivery_ids.clone()),
            (1, vec![d[0].id.clone()])
        );
        let by_class = store
            .dead_letter_selection(select(Some(0), Some(now + 1), Some("http_500")))
            .await
            .unwrap();
        assert_eq!(by_class.count, 1);
        let other = store
            .dead_letter_selection(select(None, None, Some("timeout")))
            .await
            .unwrap();
        assert_eq!(other.count, 0);
        let later = store
            .dead_letter_selection(select(Some(now + 1), None, None))
            .await
            .unwrap();
        assert_eq!(later.count, 0);

        let t = store
            .apply_subscription_input("s", SubscriptionInput::OperatorResume, now)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.from, t.to),
            (SubscriptionState::DeadLettered, SubscriptionState::Active)
        );
        assert!(store
            .apply_subscription_input("s", SubscriptionInput::OperatorResume, now)
            .await
            .unwrap()
            .is_none());
    }
}

#[tokio::test]
async fn reopening_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let rid = {
        let s = SqliteStore::open_dir(dir.path()).unwrap();
        sub(&s, "s", 0).await;
        let r = receipt("s", "dk_1", b"{\"x\":1}", &["b1"]);
        let rid = r.id.clone();
        s.commit_receipt(r).await.unwrap();
        s.close().await;
        rid
    };
    let s = SqliteStore::open_dir(dir.path()).unwrap();
    assert_eq!(
        s.get_receipt(&rid).await.unwrap().state,
        ReceiptState::Routed
    );
    assert_eq!(s.lease_due("w", 5_000, 1_000, 10).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_key_is_held_for_its_window_then_released() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let mut r1 = receipt("s", "dk_w", b"1", &[]);
        r1.dedup_until = 2_500;
        let first = r1.id.clone();
        store.commit_receipt(r1).await.unwrap();
        assert!(store
            .find_duplicate("s", "dk_w", 2_499)
            .await
            .unwrap()
            .is_some());
        assert!(
            store
                .find_duplicate("s", "dk_w", 2_500)
                .await
                .unwrap()
                .is_none(),
            "window over"
        );
        let mut inside = receipt("s", "dk_w", b"2", &[]);
        inside.received_at = 2_499;
        assert!(
            matches!(store.commit_receipt(inside).await.unwrap(), IngestOutcome::Duplicate { receipt_id, .. } if receipt_id == first)
        );
        let mut after = receipt("s", "dk_w", b"3", &[]);
        after.received_at = 2_500;
        after.dedup_until = 9_000;
        let second = after.id.clone();
        assert!(matches!(
            store.commit_receipt(after).await.unwrap(),
            IngestOutcome::Accepted { .. }
        ));
        let mut again = receipt("s", "dk_w", b"4", &[]);
        again.received_at = 3_000;
        assert!(
            matches!(store.commit_receipt(again).await.unwrap(), IngestOutcome::Duplicate { receipt_id, .. } if receipt_id == second)
        );
        assert_eq!(
            store
                .list_receipts(ListQuery {
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap()
                .len(),
            2,
            "both receipts are kept"
        );
    }
}

#[tokio::test]
async fn idempotency_claims_are_atomic_replayable_and_expire() {
    for (store, _dir) in backends().await {
        let reply = StoredReply {
            status: 201,
            content_type: Some("application/json".into()),
            body: b"{\"a\":1}".to_vec(),
        };
        assert_eq!(
            store
                .idempotency_claim("p POST /x", "k1", "d1", 1_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::New {
                lease_until: 61_000
            }
        );
        assert_eq!(
            store
                .idempotency_claim("p POST /x", "k1", "d1", 2_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::InFlight {
                retry_after_ms: 59_000
            }
        );
        assert_eq!(
            store
                .idempotency_claim("p POST /x", "k1", "other", 2_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::Mismatch
        );
        store
            .idempotency_finish("p POST /x", "k1", Some(reply.clone()), 3_000)
            .await
            .unwrap();
        assert_eq!(
            store
                .idempotency_claim("p POST /x", "k1", "d1", 4_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::Replay(reply)
        );
        // Another scope is another record.
        assert_eq!(
            store
                .idempotency_claim("q POST /x", "k1", "d1", 4_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::New {
                lease_until: 64_000
            }
        );
        // A lapsed lease is taken over; a dropped claim runs again; 24 h later the key is free.
        assert_eq!(
            store
                .idempotency_claim("q POST /x", "k1", "d1", 70_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::New {
                lease_until: 130_000
            }
        );
        store
            .idempotency_finish("q POST /x", "k1", None, 70_001)
            .await
            .unwrap();
        assert_eq!(
            store
                .idempotency_claim("q POST /x", "k1", "d2", 70_002, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::New {
                lease_until: 130_002
            }
        );
        assert_eq!(
            store
                .idempotency_claim("p POST /x", "k1", "d9", 3_000 + 86_400_000, 60_000)
                .await
                .unwrap(),
            IdempotencyClaim::New {
                lease_until: 86_463_000
            }
        );
    }
}

/// A released claim is gone at once (the retry runs), but only the claim it names: a claim taken
/// over after its lease, or finished, is kept.
#[tokio::test]
async fn idempotency_release_drops_only_its_own_pending_claim() {
    for (store, _dir) in backends().await {
        let s = "p POST /x";
        let claim = |key: &'static str, now: i64| {
            let store = store.clone();
            async move {
                store
                    .idempotency_claim(s, key, "d", now, 60_000)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(
            claim("k", 1_000).await,
            IdempotencyClaim::New {
                lease_until: 61_000
            }
        );
        assert!(store.idempotency_release(s, "k", 61_000).await.unwrap());
        assert_eq!(
            claim("k", 2_000).await,
            IdempotencyClaim::New {
                lease_until: 62_000
            },
            "released: the retry runs at once"
        );
        // The first holder's lease lapses and a retry takes the claim over: the stale holder's
        // release must not drop the new holder's claim.
        assert_eq!(
            claim("k", 62_000).await,
            IdempotencyClaim::New {
                lease_until: 122_000
            }
        );
        assert!(!store.idempotency_release(s, "k", 62_000).await.unwrap());
        assert_eq!(
            claim("k", 63_000).await,
            IdempotencyClaim::InFlight {
                retry_after_ms: 59_000
            }
        );
        // A finished claim is never released.
        let reply = StoredReply {
            status: 200,
            content_type: None,
            body: b"{}".to_vec(),
        };
        store
            .idempotency_finish(s, "k", Some(reply.clone()), 64_000)
            .await
            .unwrap();
        assert!(!store.idempotency_release(s, "k", 122_000).await.unwrap());
        assert_eq!(claim("k", 65_000).await, IdempotencyClaim::Replay(reply));
    }
}

#[tokio::test]
async fn retention_sweep_removes_old_bodies_dead_letters_and_idempotency_records() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        // An old settled receipt (unmatched) and an old dead-lettered delivery.
        let old = receipt("s", "dk_old", b"old body", &[]);
        let old_id = old.id.clone();
        store.commit_receipt(old).await.unwrap();
        let r = receipt("s", "dk_dl", b"{}", &["b1"]);
        store.commit_receipt(r).await.unwrap();
        let lease = store
            .lease_due("w", 2_000, 60_000, 10)
            .await
            .unwrap()
            .remove(0);
        let c = commit_for(
            &lease,
            AttemptOutcome::DeadLettered,
            DeliveryState::DeadLettered,
            None,
            2_100,
        );
        store.commit_attempt(c).await.unwrap();
        // A queued receipt keeps its body whatever its age.
        let queued = receipt("s", "dk_q", b"queued body", &["b1"]);
        let queued_id = queued.id.clone();
        store.commit_receipt(queued).await.unwrap();
        store
            .idempotency_claim("p", "k", "d", 1_000, 1_000)
            .await
            .unwrap();

        let page = store
            .sweep(200_000_000, 10_000, 10_000, 100, SweepCursor::default())
            .await
            .unwrap();
        assert_eq!(page.next, None, "one batch covers everything");
        assert_eq!(
            page.counts,
            SweepCounts {
                bodies: 2,
                dead_letters: 1,
                idempotency: 1,
                signals: 0,
            },
            "unmatched + dead-lettered bodies"
        );
        assert!(matches!(
            store.get_body(&old_id).await,
            Err(StoreError::NotFound { .. })
        ));
        assert_eq!(
            &store.get_body(&queued_id).await.unwrap()[..],
            b"queued body"
        );
        assert_eq!(
            store.get_receipt(&old_id).await.unwrap().id,
            old_id,
            "receipts are kept"
        );
        let q = DeadLetterQuery {
            subscription_id: "s".into(),
            limit: 10,
            before: None,
            not_before: 0,
        };
        assert!(store.dead_letters(q).await.unwrap().is_empty());
        assert_eq!(
            store
                .sweep(200_000_000, 10_000, 10_000, 100, SweepCursor::default())
                .await
                .unwrap()
                .counts,
            SweepCounts::default(),
            "idempotent"
        );
    }
}

#[tokio::test]
async fn a_retention_batch_walks_by_cursor_past_kept_and_bodiless_rows() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        // 3 unsettled (routed) receipts, then 4 settled (unmatched) ones; batch of 2.
        let mut kept = Vec::new();
        for i in 0..3 {
            let r = receipt("s", &format!("dk_r{i}"), b"kept", &["b1"]);
            kept.push(r.id.clone());
            store.commit_receipt(r).await.unwrap();
        }
        let mut settled = Vec::new();
        for i in 0..4 {
            let r = receipt("s", &format!("dk_u{i}"), b"old", &[]);
            settled.push(r.id.clone());
            store.commit_receipt(r).await.unwrap();
        }
        let mut cursor = SweepCursor::default();
        let mut bodies = Vec::new();
        for _ in 0..10 {
            let page = store
                .sweep(200_000_000, 10_000, 10_000, 2, cursor)
                .await
                .unwrap();
            bodies.push(page.counts.bodies);
            match page.next {
                Some(n) => cursor = n,
                None => break,
            }
        }
        // 7 bodies in pages of 2: four pages (the last one short ends the walk), all 4 settled bodies
        // deleted although the kept ones come first (ids are time-ordered).
        assert_eq!(bodies.len(), 4, "{bodies:?}");
        assert_eq!(bodies.iter().sum::<u64>(), 4, "{bodies:?}");
        for id in &settled {
            assert!(matches!(
                store.get_body(id).await,
                Err(StoreError::NotFound { .. })
            ));
        }
        for id in &kept {
            assert_eq!(&store.get_body(id).await.unwrap()[..], b"kept");
        }
        let again = store
            .sweep(200_000_000, 10_000, 10_000, 2, SweepCursor::default())
            .await
            .unwrap();
        assert_eq!(again.counts, SweepCounts::default());
    }
}

/// A running session run started through a delivery's local effect; returns its id.
async fn session_run(s: &dyn Store, sub_id: &str) -> String {
    sub(s, sub_id, 0).await;
    let r = receipt(sub_id, &new_id(IdKind::Receipt), b"{}", &["b"]);
    s.commit_receipt(r).await.unwrap();
    let lease = s.lease_due("w", 2_001, 60_000, 1).await.unwrap().remove(0);
    let run_id = lease.delivery.run_id.clone().unwrap();
    let mut c = commit_for(
        &lease,
        AttemptOutcome::Delivered,
        DeliveryState::Delivered,
        None,
        2_002,
    );
    c.effect = Some(Effect::StartSession {
        run: NewRun {
            id: run_id.clone(),
            workflow_id: "pr-session".into(),
            inputs: json!({}),
            status: RunStatus::Running,
            dead_letter: None,
            session: Some((
                json!({"system": "start"}),
                tb_core::signal::MailboxPolicy::default(),
            )),
        },
        coalesce: None,
    });
    let done = s.commit_attempt(c).await.unwrap();
    assert_eq!(done.run_id.as_deref(), Some(run_id.as_str()));
    run_id
}

fn api_signal(id: &str, name: &str) -> NewSignal {
    NewSignal {
        signal_id: id.into(),
        name: name.into(),
        source: tb_core::signal::SignalSource {
            kind: tb_core::signal::SourceKind::Api,
            receipt_id: None,
            actor_id: None,
        },
        data: tb_core::signal::DataPlacement::None,
        wake: false,
        delivery_id: None,
    }
}

fn spec(
    kind: tb_core::wait::WaitKind,
    names: &[&str],
    timeout_ms: Option<u64>,
) -> tb_core::wait::WaitSpec {
    tb_core::wait::WaitSpec {
        kind,
        names: names.iter().map(|s| s.to_string()).collect(),
        timeout_ms,
        user_input: kind == tb_core::wait::WaitKind::Any,
        reason: "test".into(),
    }
}

#[tokio::test]
async fn candidates_visible_together_resolve_by_precedence() {
    use tb_core::wait::{WaitKind, WaitState};
    for (s, _dir) in backends().await {
        let run = session_run(&*s, "sessions").await;
        // Timer due and a matching signal in the same step (the timer loop had not fired yet): the
        // signal wins and the timer is tombstoned.
        let w = s
            .create_wait(
                &run,
                "wait_1",
                spec(WaitKind::Signal, &["ci"], Some(1_000)),
                10_000,
            )
            .await
            .unwrap();
        assert_eq!((w.state, w.deadline), (WaitState::Armed, Some(11_000)));
        let out = s
            .raise_signal(&run, api_signal("s1", "ci"), 20_000)
            .await
            .unwrap();
        assert_eq!(out.consumed_by.as_deref(), Some("wait_1"));
        let w = s.get_wait(&run, "wait_1").await.unwrap();
        assert_eq!(w.winner.unwrap()["kind"], "signal");
        assert_eq!(
            w.losers,
            json!([{"kind": "timer", "disposition": "tombstoned"}])
        );

        // An `any` race whose deadline passed when user input arrives: user input beats the timer.
        s.create_wait(
            &run,
            "wait_2",
            spec(WaitKind::Any, &["ci"], Some(1_000)),
            30_000,
        )
        .await
        .unwrap();
        let turn = s
            .enqueue_prompt(
                &run,
                NewPrompt {
                    text: "hi".into(),
                    variables: json!(null),
                    from: "user".into(),
                    delivery_id: None,
                },
                40_000,
            )
            .await
            .unwrap();
        let w = s.get_wait(&run, "wait_2").await.unwrap();
        assert_eq!(w.winner.as_ref().unwrap()["kind"], "user_input");
        assert_eq!(w.winner.unwrap()["turnId"], json!(turn.id));
        assert_eq!(
            w.losers,
            json!([{"kind": "timer", "disposition": "tombstoned"}])
        );

        // Timers: only due, armed waits fire; the earliest deadline is reported.
        s.create_wait(
            &run,
            "wait_3",
            spec(WaitKind::Signal, &["x"], Some(5_000)),
            50_000,
        )
        .await
        .unwrap();
        assert_eq!(s.next_timer_at().await.unwrap(), Some(55_000));
        assert_eq!(s.fire_timers(54_999, 10).await.unwrap(), 0);
        assert_eq!(s.fire_timers(55_000, 10).await.unwrap(), 1);
        let w = s.get_wait(&run, "wait_3").await.unwrap();
        assert_eq!(w.winner.unwrap()["kind"], "timer");
        assert_eq!(s.next_timer_at().await.unwrap(), None);

        // Stop beats a buffered match when the run ends: the wait resolves `stop`, the signal stays.
        s.raise_signal(&run, api_signal("left", "leftover"), 60_500)
            .await
            .unwrap();
        s.create_wait(
            &run,
            "wait_4",
            spec(WaitKind::Signal, &["late"], None),
            60_000,
        )
        .await
        .unwrap();
        s.finish_run(&run, RunStatus::Cancelled, None, 61_000)
            .await
            .unwrap();
        let w = s.get_wait(&run, "wait_4").await.unwrap();
        assert_eq!(w.winner.unwrap()["kind"], "stop");
        let left = s.list_signals(&run, None, 500).await.unwrap().signals;
        assert_eq!(
            left.first().unwrap().state,
            "expired",
            "buffered signals expire with the run"
        );
        let turns = s.list_turns(&run).await.unwrap();
        assert!(!turns.is_empty());
        assert!(
            turns
                .iter()
                .all(|t| t.state != tb_core::turn::TurnState::Queued
                    && t.state != tb_core::turn::TurnState::Leased),
            "unacknowledged turns expire with the run: {turns:?}"
        );
        assert!(turns
            .iter()
            .any(|t| t.state == tb_core::turn::TurnState::Expired));
        let events = s.run_events(&run, None, 100).await.unwrap();
        assert_eq!(
            events.last().unwrap().event_type,
            "run.cancelled",
            "terminal event last"
        );
        assert!(matches!(
            s.raise_signal(&run, api_signal("s9", "late"), 62_000).await,
            Err(StoreError::Rejected {
                code: tb_core::ErrorCode::TargetTerminal,
                ..
            })
        ));
    }
}

#[tokio::test]
async fn turns_are_claimed_in_order_leased_and_redelivered() {
    for (s, _dir) in backends().await {
        let run = session_run(&*s, "turns").await;
        let start = s.claim_turn(&run, 1_000, 3_000).await.unwrap().unwrap();
        assert_eq!(start.kind, tb_core::turn::TurnKind::Start);
        assert!(
            s.claim_turn(&run, 1_000, 3_500).await.unwrap().is_none(),
            "one turn at a time while its lease holds"
        );
        let again = s.claim_turn(&run, 1_000, 4_001).await.unwrap().unwrap();
        assert_eq!(
            (again.id.as_str(), again.claims),
            (start.id.as_str(), 2),
            "redelivered after the lease"
        );
        assert!(
            matches!(
                s.ack_turn(&run, &start.id, 1, 4_002).await,
                Err(StoreError::Conflict(_))
            ),
            "the first claim's lease lapsed and the turn was claimed again"
        );
        s.ack_turn(&run, &start.id, 2, 4_002).await.unwrap();
        assert!(matches!(
            s.ack_turn(&run, &start.id, 2, 4_003).await,
            Err(StoreError::Conflict(_))
        ));
        assert!(s.claim_turn(&run, 1_000, 4_004).await.unwrap().is_none());
    }
}

#[tokio::test]
async fn a_signal_for_a_session_still_starting_waits_instead_of_failing() {
    for (s, _dir) in backends().await {
        sub(&*s, "gh", 0).await;
        // The `opened` receipt: its coalescing start_run delivery is queued, not yet performed.
        let mut r = receipt("gh", "opened-1", b"{}", &["start"]);
        r.deliveries[0].workflow_id = Some("pr-session".into());
        r.deliveries[0].run_id = None;
        r.deliveries[0].params = Some(json!({"coalesceKey": "o/r#1"}));
        s.commit_receipt(r).await.unwrap();
        // The `synchronize` receipt's raise_signal is attempted first.
        let mut r2 = receipt("gh", "sync-1", b"{}", &["events"]);
        r2.deliveries[0].action = "raise_signal".into();
        r2.deliveries[0].run_id = None;
        r2.received_at = 2_500;
        s.commit_receipt(r2).await.unwrap();
        let leases = s.lease_due("w", 3_000, 60_000, 10).await.unwrap();
        let (start, raise) = match leases[0].delivery.action.as_str() {
            "start_run" => (&leases[0], &leases[1]),
            _ => (&leases[1], &leases[0]),
        };
        let target = Target::Session {
            workflow_id: "pr-session".into(),
            key: "o/r#1".into(),
        };
        let raise_commit = |lease: &Lease, now| {
            let mut c = commit_for(
                lease,
                AttemptOutcome::Delivered,
                DeliveryState::Delivered,
                None,
                now,
            );
            c.effect = Some(Effect::RaiseSignal {
                target: target.clone(),
                signal: NewSignal {
                    delivery_id: Some(lease.delivery.id.clone()),
                    ..api_signal(&lease.delivery.id, "pr.synchronize")
                },
            });
            c
        };
        match s.commit_attempt(raise_commit(raise, 3_001)).await {
            Err(StoreError::Rejected { code, .. }) => {
                assert_eq!(
                    code,
                    tb_core::ErrorCode::Unavailable,
                    "retryable while starting"
                )
            }
            other => panic!("expected a retryable refusal, got {other:?}"),
        }
        // The session starts; then the same delivery's signal lands.
        let run_id = new_id(IdKind::Run);
        let mut c = commit_for(
            start,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            3_002,
        );
        c.effect = Some(Effect::StartSession {
            run: NewRun {
                id: run_id.clone(),
                workflow_id: "pr-session".into(),
                inputs: json!({}),
                status: RunStatus::Running,
                dead_letter: None,
                session: Some((json!({}), tb_core::signal::MailboxPolicy::default())),
            },
            coalesce: Some(Box::new(Coalesce {
                workflow_id: "pr-session".into(),
                key: "o/r#1".into(),
                on_existing: tb_core::binding::OnExisting::Signal,
                signal: None,
                prompt: None,
            })),
        });
        assert_eq!(
            s.commit_attempt(c).await.unwrap().run_id.as_deref(),
            Some(run_id.as_str())
        );
        let done = s.commit_attempt(raise_commit(raise, 3_003)).await.unwrap();
        assert_eq!(done.run_id.as_deref(), Some(run_id.as_str()));
        let sigs = s.list_signals(&run_id, None, 500).await.unwrap().signals;
        assert_eq!(sigs.len(), 1);
        assert_eq!(sigs[0].signal["name"], "pr.synchronize");
        // With no session and no start queued for a key, the target is missing (permanent).
        let mut r3 = receipt("gh", "sync-2", b"{}", &["events"]);
        r3.deliveries[0].action = "raise_signal".into();
        s.commit_receipt(r3).await.unwrap();
        let l = s.lease_due("w", 4_000, 60_000, 10).await.unwrap().remove(0);
        let mut c = commit_for(
            &l,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            4_001,
        );
        c.effect = Some(Effect::RaiseSignal {
            target: Target::Session {
                workflow_id: "pr-session".into(),
                key: "o/r#404".into(),
            },
            signal: api_signal("x", "pr.closed"),
        });
        assert!(matches!(
            s.commit_attempt(c).await,
            Err(StoreError::Rejected {
                code: tb_core::ErrorCode::NotFound,
                ..
            })
        ));
    }
}

#[tokio::test]
async fn a_webhook_signal_an_armed_wait_takes_at_once_settles_its_receipt() {
    for (s, _dir) in backends().await {
        let run = session_run(&*s, "gh").await;
        let spec = tb_core::wait::WaitSpec {
            kind: tb_core::wait::WaitKind::Signal,
            names: vec!["pr.closed".into()],
            timeout_ms: None,
            user_input: false,
            reason: "until the PR closes".into(),
        };
        s.create_wait(&run, "wait_c", spec, 3_000).await.unwrap();
        let mut r = receipt("gh", "closed-1", b"{}", &["events"]);
        r.deliveries[0].action = "raise_signal".into();
        r.deliveries[0].run_id = None;
        let receipt_id = r.id.clone();
        s.commit_receipt(r).await.unwrap();
        let lease = s.lease_due("w", 3_001, 60_000, 1).await.unwrap().remove(0);
        let d = lease.delivery.id.clone();
        let mut c = commit_for(
            &lease,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            3_002,
        );
        c.effect = Some(Effect::RaiseSignal {
            target: Target::Run(run.clone()),
            signal: NewSignal {
                delivery_id: Some(d.clone()),
                ..api_signal("closed-1", "pr.closed")
            },
        });
        s.commit_attempt(c).await.unwrap();
        let w = s.get_wait(&run, "wait_c").await.unwrap();
        assert_eq!(w.state, tb_core::wait::WaitState::Resolved);
        assert_eq!(w.winner.unwrap()["signal"]["signalId"], "closed-1");
        assert_eq!(s.get_delivery(&d).await.unwrap().consumed_at, Some(3_002));
        assert_eq!(
            s.get_receipt(&receipt_id).await.unwrap().state,
            ReceiptState::Consumed,
            "the wait consumed the signal in the attempt's own transaction"
        );
    }
}

#[tokio::test]
async fn a_lease_renews_only_for_its_own_grant() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        store
            .commit_receipt(receipt("s", "dk_1", b"{}", &["b1"]))
            .await
            .unwrap();
        let lease = store
            .lease_due("w1", 2_000, 300, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!((lease.lease_until, lease.lease_ms), (2_300, 300));
        let id = lease.delivery.id.clone();
        // The holder renews before expiry: extended by lease_ms from now, and not due meanwhile.
        let until = store.renew_lease(&id, &lease.token, 2_100, 300).await;
        assert_eq!(until.unwrap(), 2_400);
        assert!(store
            .lease_due("w2", 2_350, 300, 10)
            .await
            .unwrap()
            .is_empty());
        // Another token, or a lapsed lease, never extends.
        let lost = |r: StoreResult<i64>| matches!(r, Err(StoreError::LeaseLost(_)));
        assert!(lost(store.renew_lease(&id, "lse_other", 2_200, 300).await));
        assert!(lost(store.renew_lease(&id, &lease.token, 2_400, 300).await));
        // Once lapsed another worker takes it; the first holder cannot extend or release the new grant.
        let taken = store
            .lease_due("w2", 2_401, 300, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(taken.lease_until, 2_701);
        assert_ne!(taken.token, lease.token, "every grant mints a new token");
        assert!(lost(store.renew_lease(&id, &lease.token, 2_450, 300).await));
        assert!(matches!(
            store.release_lease(&id, &lease.token, 2_450).await,
            Err(StoreError::LeaseLost(_))
        ));
        assert_eq!(
            store
                .renew_lease(&id, &taken.token, 2_450, 300)
                .await
                .unwrap(),
            2_750
        );
        // Its own release gives it back at once, and the token no longer renews.
        store.release_lease(&id, &taken.token, 2_460).await.unwrap();
        assert!(lost(store.renew_lease(&id, &taken.token, 2_470, 300).await));
        let again = store.lease_due("w3", 2_460, 300, 10).await.unwrap();
        assert_eq!(again.len(), 1, "due again at the release");
    }
}

#[tokio::test]
async fn failure_streak_message_and_state_listing_are_kept() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        for k in ["dk_1", "dk_2"] {
            store
                .commit_receipt(receipt("s", k, b"{}", &["b1"]))
                .await
                .unwrap();
        }
        let leases = store.lease_due("w", 2_000, 60_000, 10).await.unwrap();
        let (a, b) = (&leases[0], &leases[1]);
        store
            .commit_attempt(commit_for(
                a,
                AttemptOutcome::Retrying,
                DeliveryState::Retrying,
                None,
                3_000,
            ))
            .await
            .unwrap();
        let s = store.get_subscription("s").await.unwrap();
        assert_eq!(
            (s.consecutive_failures, s.first_failure_at),
            (1, Some(3_000))
        );
        assert_eq!(s.last_error.as_deref(), Some("http_500: HTTP 500: db down"));
        let att = store.attempts(&a.delivery.id).await.unwrap();
        assert_eq!(att[0].message.as_deref(), Some("HTTP 500: db down"));
        // The dead-lettering attempt 4 s into the streak: the streak keeps its start.
        store
            .commit_attempt(commit_for(
                b,
                AttemptOutcome::DeadLettered,
                DeliveryState::DeadLettered,
                None,
                7_000,
            ))
            .await
            .unwrap();
        let s = store.get_subscription("s").await.unwrap();
        assert_eq!(
            (s.consecutive_failures, s.first_failure_at),
            (2, Some(3_000))
        );
        assert_eq!(
            (s.state, s.state_since),
            (SubscriptionState::DeadLettered, 7_000)
        );
        let dead = store
            .subscriptions_in_state(SubscriptionState::DeadLettered)
            .await
            .unwrap();
        assert_eq!(
            dead.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            vec!["s"]
        );
        assert!(store
            .subscriptions_in_state(SubscriptionState::Active)
            .await
            .unwrap()
            .is_empty());
        // Resume clears the streak.
        store
            .apply_subscription_input("s", SubscriptionInput::OperatorResume, 8_000)
            .await
            .unwrap();
        let s = store.get_subscription("s").await.unwrap();
        assert_eq!(
            (
                s.state,
                s.state_since,
                s.consecutive_failures,
                s.first_failure_at
            ),
            (SubscriptionState::Active, 8_000, 0, None)
        );
    }
}

#[tokio::test]
async fn a_stale_token_of_the_same_owner_is_refused_after_a_re_lease() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        store
            .commit_receipt(receipt("s", "dk_1", b"{}", &["b1"]))
            .await
            .unwrap();
        let old = store
            .lease_due("w1", 2_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        // The lease lapses and the SAME worker takes the delivery again: a new grant, a new token.
        let new = store
            .lease_due("w1", 3_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!((old.owner.as_str(), new.owner.as_str()), ("w1", "w1"));
        assert_ne!(old.token, new.token);
        assert!(new.token.starts_with("lse_"), "{}", new.token);
        let id = new.delivery.id.clone();
        let lost = |r: StoreResult<AttemptCommitted>| matches!(r, Err(StoreError::LeaseLost(_)));
        let late = commit_for(
            &old,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            3_100,
        );
        assert!(
            lost(store.commit_attempt(late).await),
            "the stale grant's completion"
        );
        assert!(matches!(
            store.renew_lease(&id, &old.token, 3_100, 1_000).await,
            Err(StoreError::LeaseLost(_))
        ));
        assert!(matches!(
            store.release_lease(&id, &old.token, 3_100).await,
            Err(StoreError::LeaseLost(_))
        ));
        // The lapsed grant's attempt was recorded `lost` by the re-lease.
        assert_eq!(store.get_delivery(&id).await.unwrap().attempts, 1);
        let ok = commit_for(
            &new,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            3_200,
        );
        store.commit_attempt(ok).await.unwrap();
        // The completion cleared the token: the same grant cannot record the attempt twice.
        let twice = commit_for(
            &new,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            None,
            3_300,
        );
        assert!(lost(store.commit_attempt(twice).await));
        let d = store.get_delivery(&id).await.unwrap();
        assert_eq!(
            (
                d.state,
                d.attempts,
                d.lease_owner,
                d.lease_until,
                d.updated_at
            ),
            (DeliveryState::Delivered, 2, None, None, 3_200)
        );
        let attempts = store.attempts(&id).await.unwrap();
        assert_eq!(
            attempts
                .iter()
                .map(|a| (a.attempt, a.outcome))
                .collect::<Vec<_>>(),
            vec![(1, AttemptOutcome::Lost), (2, AttemptOutcome::Delivered)]
        );
    }
}

#[tokio::test]
async fn a_delivered_attempt_of_a_healthy_subscription_leaves_its_row_unwritten() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        for k in ["dk_1", "dk_2", "dk_3", "dk_4"] {
            store
                .commit_receipt(receipt("s", k, b"{}", &["b1"]))
                .await
                .unwrap();
        }
        let mut leases = store.lease_due("w1", 2_000, 60_000, 10).await.unwrap();
        assert_eq!(leases.len(), 4);
        let mut next = || leases.remove(0);
        let delivered = |l: &Lease, now| {
            commit_for(
                l,
                AttemptOutcome::Delivered,
                DeliveryState::Delivered,
                None,
                now,
            )
        };
        // The first success is recorded (no last_success_at yet).
        store
            .commit_attempt(delivered(&next(), 3_000))
            .await
            .unwrap();
        let before = store.get_subscription("s").await.unwrap();
        assert_eq!(
            (
                before.last_success_at,
                before.consecutive_failures,
                before.updated_at
            ),
            (Some(3_000), 0, 1_000)
        );
        // Another within the resolution (1 s): the row is not written at all.
        store
            .commit_attempt(delivered(&next(), 3_500))
            .await
            .unwrap();
        assert_eq!(store.get_subscription("s").await.unwrap(), before);
        // A failure is written, and the next success resets the streak.
        let fail = commit_for(
            &next(),
            AttemptOutcome::Retrying,
            DeliveryState::Retrying,
            None,
            3_600,
        );
        store.commit_attempt(fail).await.unwrap();
        let failed = store.get_subscription("s").await.unwrap();
        assert_eq!(
            (
                failed.consecutive_failures,
                failed.first_failure_at,
                failed.last_success_at
            ),
            (1, Some(3_600), Some(3_000))
        );
        store
            .commit_attempt(delivered(&next(), 3_700))
            .await
            .unwrap();
        let reset = store.get_subscription("s").await.unwrap();
        assert_eq!(
            (
                reset.consecutive_failures,
                reset.first_failure_at,
                reset.last_success_at
            ),
            (0, None, Some(3_700))
        );
    }
}

#[tokio::test]
async fn a_replay_reopens_once_and_a_run_finishes_once() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let r = receipt("s", "dk_1", b"{}", &["b1"]);
        let rid = r.id.clone();
        store.commit_receipt(r).await.unwrap();
        let lease = store
            .lease_due("w1", 2_000, 60_000, 10)
            .await
            .unwrap()
            .remove(0);
        let id = lease.delivery.id.clone();
        let dead = commit_for(
            &lease,
            AttemptOutcome::DeadLettered,
            DeliveryState::DeadLettered,
            None,
            2_100,
        );
        store.commit_attempt(dead).await.unwrap();
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::DeadLettered
        );
        let d = store.get_delivery(&id).await.unwrap();
        assert_eq!(d.dead_letter_reason.as_deref(), Some("retries_exhausted"));

        let d = store.replay_delivery(&id, 5_000).await.unwrap();
        assert_eq!(
            (
                d.state,
                d.due_at,
                d.replays,
                d.attempts,
                d.dead_letter_reason,
                d.lease_owner
            ),
            (DeliveryState::Pending, Some(5_000), 1, 1, None, None)
        );
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Routed
        );
        match store.replay_delivery(&id, 5_001).await {
            Err(StoreError::Conflict(m)) => assert_eq!(
                m,
                "only dead-lettered deliveries can be replayed; this one is pending"
            ),
            other => panic!("{other:?}"),
        }
        // Attempt numbers continue: the replayed delivery's next attempt is 2, and it starts the run.
        let again = store
            .lease_due("w1", 5_000, 60_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(again.delivery.attempts, 1);
        let run_id = again.delivery.run_id.clone().unwrap();
        let run = NewRun {
            id: run_id.clone(),
            workflow_id: "noop".into(),
            inputs: json!({"pr": 1}),
            status: RunStatus::Running,
            dead_letter: None,
            session: None,
        };
        let ok = commit_for(
            &again,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            Some(run),
            5_100,
        );
        assert_eq!(
            store.commit_attempt(ok).await.unwrap().run_id.as_deref(),
            Some(run_id.as_str())
        );
        let attempts = store.attempts(&id).await.unwrap();
        assert_eq!(
            attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Consumed
        );

        let conflict = |r: StoreResult<RunRecord>| match r {
            Err(StoreError::Conflict(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            conflict(
                store
                    .finish_run(&run_id, RunStatus::Running, None, 6_000)
                    .await
            ),
            "running is not a terminal status"
        );
        let done = store
            .finish_run(
                &run_id,
                RunStatus::Completed,
                Some(json!({"ok": true})),
                6_000,
            )
            .await
            .unwrap();
        assert_eq!(
            (done.status, done.output, done.updated_at),
            (RunStatus::Completed, Some(json!({"ok": true})), 6_000)
        );
        assert_eq!(
            conflict(
                store
                    .finish_run(&run_id, RunStatus::Failed, None, 6_100)
                    .await
            ),
            "the run is already completed"
        );
        let log = store.run_events(&run_id, None, 10).await.unwrap();
        assert_eq!(
            log.iter()
                .map(|e| e.event_type.as_str())
                .collect::<Vec<_>>(),
            vec!["run.started", "trigger.delivery.attempted", "run.completed"]
        );
        assert!(matches!(
            store
                .finish_run("run_missing", RunStatus::Completed, None, 6_000)
                .await,
            Err(StoreError::NotFound { .. })
        ));
    }
}

#[tokio::test]
async fn an_outbound_webhook_delivery_without_a_receipt_row_records_its_attempt() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let hook = "wh_test".to_string();
        store
            .create_webhook(
                WebhookRecord {
                    id: hook.clone(),
                    url: "https://example.test/hook".into(),
                    events: vec!["run.completed".into()],
                    tenant_id: "t".into(),
                    secret_file: "hook.secret".into(),
                    standard_secret_file: None,
                    created_at: 1_000,
                },
                SubscriptionDef {
                    id: hook.clone(),
                    source: Source::Webhook,
                    connector: "webhook".into(),
                    config: json!({}),
                    failure_threshold: 0,
                },
            )
            .await
            .unwrap();
        store
            .commit_receipt(receipt("s", "dk_1", b"{}", &["b1"]))
            .await
            .unwrap();
        let lease = store
            .lease_due("w1", 2_000, 60_000, 10)
            .await
            .unwrap()
            .remove(0);
        let run = NewRun {
            id: lease.delivery.run_id.clone().unwrap(),
            workflow_id: "noop".into(),
            inputs: json!({}),
            status: RunStatus::Completed,
            dead_letter: None,
            session: None,
        };
        let c = commit_for(
            &lease,
            AttemptOutcome::Delivered,
            DeliveryState::Delivered,
            Some(run),
            2_100,
        );
        store.commit_attempt(c).await.unwrap();
        // run.completed fanned out to the webhook: a delivery whose receipt column holds the event id.
        let out = store.lease_due("w1", 2_200, 60_000, 10).await.unwrap();
        assert_eq!(out.len(), 1);
        let w = &out[0];
        assert_eq!(
            (
                w.delivery.subscription_id.as_str(),
                w.delivery.action.as_str()
            ),
            (hook.as_str(), "webhook")
        );
        assert!(
            store.get_receipt(&w.delivery.receipt_id).await.is_err(),
            "no receipt row"
        );
        let fail = commit_for(
            w,
            AttemptOutcome::DeadLettered,
            DeliveryState::DeadLettered,
            None,
            2_300,
        );
        store.commit_attempt(fail).await.unwrap();
        let d = store.get_delivery(&w.delivery.id).await.unwrap();
        assert_eq!((d.state, d.attempts), (DeliveryState::DeadLettered, 1));
        assert_eq!(
            store
                .get_subscription(&hook)
                .await
                .unwrap()
                .consecutive_failures,
            1
        );
    }
}

/// `receipt` with a hand-off request: lease up to `limit` pending deliveries to `owner` at commit.
fn leased_receipt(key: &str, bindings: &[&str], limit: u32, lease_ms: u64) -> NewReceipt {
    let mut r = receipt("s", key, b"{}", bindings);
    r.lease = Some(LeaseRequest {
        owner: "w-local".into(),
        lease_ms,
        limit,
    });
    r
}

fn delivered(lease: &Lease, now: i64) -> AttemptCommit {
    let run = NewRun {
        id: lease.delivery.run_id.clone().unwrap(),
        workflow_id: "noop".into(),
        inputs: json!({"pr": 1}),
        status: RunStatus::Completed,
        dead_letter: None,
        session: None,
    };
    commit_for(
        lease,
        AttemptOutcome::Delivered,
        DeliveryState::Delivered,
        Some(run),
        now,
    )
}

#[tokio::test]
async fn deliveries_leased_at_commit_are_not_leased_again_and_their_receipt_settles() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let r = leased_receipt("dk_h", &["b1", "b2", "b3"], 2, 1_000);
        let rid = r.id.clone();
        let ids: Vec<String> = r.deliveries.iter().map(|d| d.id.clone()).collect();
        let IngestOutcome::Accepted { leased, .. } = store.commit_receipt(r).await.unwrap() else {
            panic!("a new key is accepted")
        };
        // The first two pending deliveries, in order, under one fresh grant of 1 000 ms from 2 000.
        assert_eq!(
            leased
                .iter()
                .map(|l| l.delivery.id.as_str())
                .collect::<Vec<_>>(),
            vec![ids[0].as_str(), ids[1].as_str()]
        );
        for l in &leased {
            assert!(l.token.starts_with("lse_"), "{}", l.token);
            assert_eq!(l.token, leased[0].token);
            assert_eq!(
                (l.owner.as_str(), l.lease_until, l.lease_ms),
                ("w-local", 3_000, 1_000)
            );
            assert_eq!(l.delivery.state, DeliveryState::Pending);
            assert_eq!(l.delivery.attempts, 0);
            assert_eq!(l.delivery.lease_until, Some(3_000));
            assert_eq!(l.delivery.lease_owner.as_deref(), Some("w-local"));
        }
        // Only the third is due; the handed ones are not before their lease ends.
        let due = store.lease_due("w2", 2_999, 60_000, 10).await.unwrap();
        assert_eq!(
            due.iter()
                .map(|l| l.delivery.id.as_str())
                .collect::<Vec<_>>(),
            vec![ids[2].as_str()]
        );
        assert!(store
            .lease_due("w2", 2_999, 60_000, 10)
            .await
            .unwrap()
            .is_empty());
        // The handed leases complete without a lease transaction; the receipt settles on the last.
        store
            .commit_attempt(delivered(&leased[0], 2_100))
            .await
            .unwrap();
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Routed
        );
        store
            .commit_attempt(delivered(&due[0], 2_200))
            .await
            .unwrap();
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Routed
        );
        store
            .commit_attempt(delivered(&leased[1], 2_300))
            .await
            .unwrap();
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Consumed
        );
        for id in &ids {
            let d = store.get_delivery(id).await.unwrap();
            assert_eq!((d.state, d.attempts), (DeliveryState::Delivered, 1));
            assert_eq!(store.attempts(id).await.unwrap().len(), 1);
        }
    }
}

#[tokio::test]
async fn a_handed_lease_never_completed_is_leased_again_after_it_ends() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let IngestOutcome::Accepted { mut leased, .. } = store
            .commit_receipt(leased_receipt("dk_c", &["b1"], 8, 1_000))
            .await
            .unwrap()
        else {
            panic!("a new key is accepted")
        };
        assert_eq!(leased.len(), 1, "one pending delivery, one lease");
        let handed = leased.remove(0);
        // The worker that got it "crashed": nothing completes it. It lapses at 3 000.
        assert!(store
            .lease_due("w2", 2_999, 1_000, 10)
            .await
            .unwrap()
            .is_empty());
        let again = store
            .lease_due("w2", 3_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(again.delivery.id, handed.delivery.id);
        assert_ne!(again.token, handed.token, "a new grant, a new token");
        assert!(matches!(
            store.commit_attempt(delivered(&handed, 3_050)).await,
            Err(StoreError::LeaseLost(_))
        ));
        store
            .commit_attempt(delivered(&again, 3_100))
            .await
            .unwrap();
        // The handed attempt that never completed is recorded `lost`, then the one that did.
        let outcomes: Vec<AttemptOutcome> = store
            .attempts(&again.delivery.id)
            .await
            .unwrap()
            .iter()
            .map(|a| a.outcome)
            .collect();
        assert_eq!(
            outcomes,
            vec![AttemptOutcome::Lost, AttemptOutcome::Delivered]
        );
        let d = store.get_delivery(&again.delivery.id).await.unwrap();
        assert_eq!(d.state, DeliveryState::Delivered);
    }
}

#[tokio::test]
async fn a_duplicate_commit_hands_nothing() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let first = leased_receipt("dk_d", &["b1"], 1, 60_000);
        let IngestOutcome::Accepted { leased, .. } = store.commit_receipt(first).await.unwrap()
        else {
            panic!("a new key is accepted")
        };
        assert_eq!(leased.len(), 1);
        let again = leased_receipt("dk_d", &["b1"], 1, 60_000);
        let out = store.commit_receipt(again).await.unwrap();
        let IngestOutcome::Duplicate { deliveries, .. } = out else {
            panic!("the key is taken: {out:?}")
        };
        assert_eq!(deliveries.len(), 1);
        assert_eq!(deliveries[0].delivery_id, leased[0].delivery.id);
        // The first grant still holds the delivery, with its token.
        assert!(store
            .lease_due("w2", 61_999, 60_000, 10)
            .await
            .unwrap()
            .is_empty());
        let d = store.get_delivery(&leased[0].delivery.id).await.unwrap();
        assert_eq!(d.lease_until, Some(62_000));
        store
            .commit_attempt(delivered(&leased[0], 2_100))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_receipt_with_several_deliveries_settles_when_the_last_one_ends() {
    for (store, _dir) in backends().await {
        sub(&*store, "s", 0).await;
        let r = receipt("s", "dk_m", b"{}", &["b1", "b2"]);
        let rid = r.id.clone();
        store.commit_receipt(r).await.unwrap();
        let leases = store.lease_due("w", 2_000, 60_000, 10).await.unwrap();
        assert_eq!(leases.len(), 2);
        // One dead-letters (permanently), the other is delivered: the receipt settles at the second.
        let mut failed = commit_for(
            &leases[0],
            AttemptOutcome::DeadLettered,
            DeliveryState::DeadLettered,
            None,
            2_100,
        );
        failed.report.failure.as_mut().unwrap().permanent = true;
        store.commit_attempt(failed).await.unwrap();
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::Routed
        );
        store
            .commit_attempt(delivered(&leases[1], 2_200))
            .await
            .unwrap();
        // The dead letter (its own class, not a routing or target reason) names the receipt's state.
        assert_eq!(
            store.get_receipt(&rid).await.unwrap().state,
            ReceiptState::DeadLettered
        );
        let d = store.get_delivery(&leases[0].delivery.id).await.unwrap();
        assert_eq!(
            (d.state, d.dead_letter_reason.as_deref()),
            (DeliveryState::DeadLettered, Some("http_500"))
        );
    }
}
