//! Several replicas on one PostgreSQL schema: two `PgStore` handles (two connection pools, as two
//! processes would have) race on the same rows on a multi-thread runtime. The lease token and the row
//! locks must let exactly one of them win.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::{AttemptFailure, AttemptReport};
use tb_core::delivery::{AttemptDecision, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::subscription::{FailurePolicy, Source};
use tokio::sync::Barrier;
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::*;

/// Two handles on one fresh schema, and the schema's guard.
async fn two_replicas() -> Option<(Arc<PgStore>, Arc<PgStore>, TestDatabase)> {
    let db = TestDatabase::create()?;
    let a = PgStore::connect(db.url(), PoolOptions::default())
        .await
        .expect("replica a");
    let b = PgStore::connect(db.url(), PoolOptions::default())
        .await
        .expect("replica b");
    Some((Arc::new(a), Arc::new(b), db))
}

async fn setup(store: &PgStore, receipts: usize) {
    store
        .upsert_subscription(
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
    for i in 0..receipts {
        store
            .commit_receipt(NewReceipt {
                id: new_id(IdKind::Receipt),
                source: tb_core::receipt::ReceiptSource::Webhook,
                subscription_id: "s".into(),
                dedup_key: format!("dk_{i}"),
                provider_event_id: format!("pe_{i}"),
                event_type: "push".into(),
                normalized: json!({}),
                state: ReceiptState::Routed,
                content_type: None,
                body: Bytes::from_static(b"{}"),
                received_at: 2_000,
                dedup_until: 2_000 + 86_400_000,
                deliveries: vec![NewDelivery {
                    id: new_id(IdKind::Delivery),
                    kind: tb_core::delivery::DeliveryKind::Binding,
                    binding_id: "b1".into(),
                    action: "start_run".into(),
                    workflow_id: Some("noop".into()),
                    run_id: Some(new_id(IdKind::Run)),
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
    }
}

/// A failed attempt that retries at once (it locks and writes the subscription row as well).
fn retry(lease: &Lease, now: i64) -> AttemptCommit {
    AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: lease.token.clone(),
                attempt: lease.delivery.attempts + 1,
            },
            event_id: new_id(IdKind::Event),
            decision: AttemptDecision::Retry { delay_ms: 0 },
            failure: Some(AttemptFailure {
                error_class: "http_500".into(),
                message: None,
                permanent: false,
            }),
            started_at: now,
            duration_ms: 1,
            run: None,
            effect: None,
            failure_policy: FailurePolicy {
                failure_window_ms: 0,
                dead_letter_after_ms: 0,
                dead_letter_min_failures: 1_000,
            },
        },
        effect: None,
        now,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_committing_one_lease_record_exactly_one_attempt() {
    let Some((a, b, _db)) = two_replicas().await else {
        return;
    };
    const N: usize = 16;
    setup(&a, N).await;
    for round in 1..=2u32 {
        let now = 3_000 * round as i64;
        let leases = a.lease_due("w-a", now, 60_000, 100).await.unwrap();
        assert_eq!(leases.len(), N, "round {round}");
        let mut races = Vec::new();
        for lease in leases {
            let barrier = Arc::new(Barrier::new(2));
            let racer = |s: Arc<PgStore>, lease: Lease, barrier: Arc<Barrier>| {
                tokio::spawn(async move {
                    barrier.wait().await;
                    s.commit_attempt(retry(&lease, now)).await
                })
            };
            races.push((
                lease.delivery.id.clone(),
                racer(a.clone(), lease.clone(), barrier.clone()),
                racer(b.clone(), lease, barrier),
            ));
        }
        for (id, x, y) in races {
            let (x, y) = (x.await.unwrap(), y.await.unwrap());
            let won = [&x, &y].iter().filter(|r| r.is_ok()).count();
            assert_eq!(won, 1, "{id}: {x:?} / {y:?}");
            let loser = if x.is_ok() { y } else { x };
            assert!(matches!(loser, Err(StoreError::LeaseLost(_))), "{loser:?}");
            let numbers: Vec<u32> = b
                .attempts(&id)
                .await
                .unwrap()
                .iter()
                .map(|a| a.attempt)
                .collect();
            assert_eq!(numbers, (1..=round).collect::<Vec<_>>(), "{id}");
        }
    }
    // Every won attempt counted once against the subscription, whichever replica wrote it.
    let s = b.get_subscription("s").await.unwrap();
    assert_eq!(s.consecutive_failures, 2 * N as u32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_leasing_at_once_take_disjoint_batches() {
    let Some((a, b, _db)) = two_replicas().await else {
        return;
    };
    const N: usize = 40;
    setup(&a, N).await;
    let barrier = Arc::new(Barrier::new(2));
    let lease_all = |s: Arc<PgStore>, owner: &'static str, barrier: Arc<Barrier>| {
        tokio::spawn(async move {
            barrier.wait().await;
            let mut got = Vec::new();
            loop {
                let batch = s.lease_due(owner, 3_000, 60_000, 3).await.unwrap();
                if batch.is_empty() {
                    return got;
                }
                got.extend(batch);
            }
        })
    };
    let x = lease_all(a.clone(), "w-a", barrier.clone());
    let y = lease_all(b.clone(), "w-b", barrier);
    let (x, y) = (x.await.unwrap(), y.await.unwrap());
    let ids = |l: &[Lease]| {
        l.iter()
            .map(|l| l.delivery.id.clone())
            .collect::<BTreeSet<_>>()
    };
    let (xs, ys) = (ids(&x), ids(&y));
    assert_eq!(xs.len() + ys.len(), N, "{} + {}", xs.len(), ys.len());
    assert!(xs.is_disjoint(&ys));
    assert!(!xs.is_empty() && !ys.is_empty(), "both replicas took work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_subscription_row_keeps_its_row_version() {
    let Some((a, _b, db)) = two_replicas().await else {
        return;
    };
    setup(&a, 2).await;
    let xmin = || {
        let cfg = db.config();
        std::thread::spawn(move || {
            let mut c = trigger_bridge_store::postgres::connect(&cfg).expect("connect");
            let row = c
                .query_one("SELECT xmin::text FROM subscriptions WHERE id = 's'", &[])
                .expect("xmin");
            row.get::<_, String>(0)
        })
        .join()
        .unwrap()
    };
    let mut leases = a.lease_due("w-a", 3_000, 60_000, 10).await.unwrap();
    let delivered = |l: &Lease, now| {
        let mut c = retry(l, now);
        c.report.decision = AttemptDecision::Delivered;
        c.report.failure = None;
        c
    };
    a.commit_attempt(delivered(&leases.remove(0), 3_000))
        .await
        .unwrap();
    let before = xmin();
    a.commit_attempt(delivered(&leases.remove(0), 3_200))
        .await
        .unwrap();
    assert_eq!(xmin(), before, "no new row version: not written");
    assert_eq!(
        a.get_subscription("s").await.unwrap().last_success_at,
        Some(3_000)
    );
}
