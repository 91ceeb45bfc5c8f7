//! Retention sweeps walk every batch: a pass with a batch of 10 over 35 settled
//! receipts, some of whose bodies are already gone, removes every due body and keeps the bodies of
//! unsettled receipts; old dead letters go the same way, across batches.

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::{AttemptFailure, AttemptReport};
use tb_core::delivery::{AttemptDecision, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::subscription::Source;
use tb_store::sqlite::SqliteStore;
use tb_store::*;
use trigger_bridge_engine::sweeper::{sweep_once, SweeperConfig};

const DAY_MS: i64 = 86_400_000;

fn receipt(received_at: i64, deliveries: usize) -> NewReceipt {
    NewReceipt {
        id: new_id(IdKind::Receipt),
        source: tb_core::receipt::ReceiptSource::Webhook,
        subscription_id: "s".into(),
        dedup_key: new_id(IdKind::Receipt),
        provider_event_id: "pe".into(),
        event_type: "pull_request.opened".into(),
        normalized: json!({"event": "pull_request"}),
        state: if deliveries == 0 {
            ReceiptState::Unmatched
        } else {
            ReceiptState::Routed
        },
        content_type: Some("application/json".into()),
        body: Bytes::from_static(b"{\"raw\":true}"),
        received_at,
        dedup_until: received_at + DAY_MS,
        deliveries: (0..deliveries)
            .map(|_| NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: tb_core::delivery::DeliveryKind::Binding,
                binding_id: "b".into(),
                action: "start_run".into(),
                workflow_id: Some("noop".into()),
                run_id: Some(new_id(IdKind::Run)),
                inputs: json!({}),
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

fn cfg(body_days: u64, dead_letter_days: u64) -> SweeperConfig {
    SweeperConfig {
        interval: Duration::from_secs(60),
        body_retention: Duration::from_millis(body_days * DAY_MS as u64),
        dead_letter_retention: Duration::from_millis(dead_letter_days * DAY_MS as u64),
        batch: 10,
    }
}

async fn open() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_dir(dir.path()).unwrap();
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
    (store, dir)
}

async fn has_body(store: &SqliteStore, id: &str) -> bool {
    match store.get_body(id).await {
        Ok(b) => {
            assert_eq!(&b[..], b"{\"raw\":true}");
            true
        }
        Err(StoreError::NotFound { .. }) => false,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_body_sweep_walks_every_batch_past_already_swept_receipts() {
    let (store, _dir) = open().await;
    // 35 settled (unmatched) receipts on days 1..=35, and 6 unsettled (routed) ones among them.
    let mut settled = Vec::new();
    let mut unsettled = Vec::new();
    for day in 1..=35i64 {
        let r = receipt(day * DAY_MS, 0);
        settled.push(r.id.clone());
        store.commit_receipt(r).await.unwrap();
        if day % 6 == 0 {
            let r = receipt(day * DAY_MS, 1);
            unsettled.push(r.id.clone());
            store.commit_receipt(r).await.unwrap();
        }
    }
    // First pass at day 50 with a 37-day retention: bodies of days 1..=12 go (two batches).
    let first = sweep_once(&store, 50 * DAY_MS, &cfg(37, 1_000))
        .await
        .unwrap();
    assert_eq!(first.bodies, 12);
    for (i, id) in settled.iter().enumerate() {
        assert_eq!(
            has_body(&store, id).await,
            i >= 12,
            "receipt of day {}",
            i + 1
        );
    }
    // Second pass at day 100 with the same retention: every other settled body goes, though the first
    // batch-worth of receipts has no body any more.
    let second = sweep_once(&store, 100 * DAY_MS, &cfg(37, 1_000))
        .await
        .unwrap();
    assert_eq!(
        second.bodies, 23,
        "35 settled bodies minus the 12 already swept"
    );
    for id in &settled {
        assert!(!has_body(&store, id).await, "settled body {id} swept");
    }
    for id in &unsettled {
        assert!(
            has_body(&store, id).await,
            "unsettled receipt {id} keeps its body"
        );
    }
    // Receipts themselves are kept, and a pass with nothing due removes nothing.
    for id in settled.iter().chain(&unsettled) {
        assert_eq!(store.get_receipt(id).await.unwrap().id, *id);
    }
    let third = sweep_once(&store, 100 * DAY_MS, &cfg(37, 1_000))
        .await
        .unwrap();
    assert_eq!(third, SweepCounts::default());
}

#[tokio::test]
async fn a_dead_letter_sweep_walks_every_batch() {
    let (store, _dir) = open().await;
    // 25 receipts with one delivery each; 23 are dead-lettered on day 2, 2 stay pending.
    for _ in 0..25 {
        store.commit_receipt(receipt(DAY_MS, 1)).await.unwrap();
    }
    let leases = store.lease_due("w", DAY_MS + 1, 60_000, 100).await.unwrap();
    assert_eq!(leases.len(), 25);
    let mut open_ids = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        if i < 2 {
            store
                .release_lease(&lease.delivery.id, &lease.token, 2 * DAY_MS)
                .await
                .unwrap();
            open_ids.push(lease.delivery.id.clone());
            continue;
        }
        let now = 2 * DAY_MS;
        store
            .commit_attempt(AttemptCommit {
                delivery_id: lease.delivery.id.clone(),
                report: AttemptReport {
                    lease: Completion {
                        token: lease.token.clone(),
                        attempt: 1,
                    },
                    event_id: new_id(IdKind::Event),
                    decision: AttemptDecision::DeadLetter,
                    failure: Some(AttemptFailure {
                        error_class: "http_500".into(),
                        message: Some("HTTP 500".into()),
                        permanent: false,
                    }),
                    started_at: now,
                    duration_ms: 3,
                    run: None,
                    effect: None,
                    failure_policy: Default::default(),
                },
                effect: None,
                now,
            })
            .await
            .unwrap();
    }
    // Bodies are kept (30-day retention); dead letters older than 14 days go, in three batches.
    let c = sweep_once(&store, 20 * DAY_MS, &cfg(30, 14)).await.unwrap();
    assert_eq!(c.dead_letters, 23);
    assert_eq!(c.bodies, 0);
    let q = ListQuery {
        limit: 100,
        before: None,
        state: Some("dead-lettered".into()),
        subscription_id: None,
        ..Default::default()
    };
    assert!(store.list_deliveries(q).await.unwrap().is_empty());
    for id in &open_ids {
        assert_eq!(
            store.get_delivery(id).await.unwrap().state,
            DeliveryState::Pending
        );
    }
    assert_eq!(
        sweep_once(&store, 20 * DAY_MS, &cfg(30, 14)).await.unwrap(),
        SweepCounts::default()
    );
}
