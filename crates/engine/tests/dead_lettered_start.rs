//! A dead-lettered subscription is not silent after a restart: `Engine::start`
//! warns once per dead-lettered subscription, naming it and since when, and the engine lists it.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tb_core::attempt::{AttemptFailure, AttemptReport};
use tb_core::delivery::{AttemptDecision, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::subscription::{FailurePolicy, SubscriptionState};
use tb_store::sqlite::SqliteStore;
use tb_store::*;
use trigger_bridge_engine::{Catalog, Engine, SubscriptionConfig};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Dead-letters subscription `github` in the store: one delivery exhausted under a policy without
/// windows, at `now` ms.
async fn dead_letter(store: &dyn Store, now: i64) {
    let sub =
        SubscriptionConfig::webhook("github", tb_core::connector::ConnectorSpec::Github, b"k");
    store
        .upsert_subscription(sub.store_def(), 1_000)
        .await
        .unwrap();
    store
        .commit_receipt(NewReceipt {
            id: new_id(IdKind::Receipt),
            source: tb_core::receipt::ReceiptSource::Webhook,
            subscription_id: "github".into(),
            dedup_key: "dk".into(),
            provider_event_id: "pe".into(),
            event_type: "push".into(),
            normalized: json!({"event": "push"}),
            state: ReceiptState::Routed,
            content_type: None,
            body: bytes::Bytes::from_static(b"{}"),
            received_at: now,
            dedup_until: now + 1,
            deliveries: vec![NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: tb_core::delivery::DeliveryKind::Binding,
                binding_id: "b".into(),
                action: "start_run".into(),
                workflow_id: Some("wf".into()),
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
    let lease = store
        .lease_due("w", now, 60_000, 1)
        .await
        .unwrap()
        .remove(0);
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
                    error_class: "connect".into(),
                    message: Some("could not connect to the worker".into()),
                    permanent: false,
                }),
                started_at: now,
                duration_ms: 1,
                run: None,
                effect: None,
                failure_policy: FailurePolicy {
                    failure_window_ms: 0,
                    dead_letter_after_ms: 0,
                    dead_letter_min_failures: 1,
                },
            },
            effect: None,
            now,
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn start_warns_about_each_dead_lettered_subscription() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    // 2025-11-30T01:22:15.056Z
    dead_letter(&*store, 1_764_465_735_056).await;

    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let sub =
        SubscriptionConfig::webhook("github", tb_core::connector::ConnectorSpec::Github, b"k");
    let engine = Engine::start(store, Catalog::new(vec![sub], vec![], vec![]))
        .await
        .unwrap();
    let logged = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("dead-lettered"))
        .collect();
    assert_eq!(lines.len(), 1, "{logged}");
    assert!(lines[0].contains(" WARN "), "{logged}");
    assert!(lines[0].contains("subscription=github"), "{logged}");
    assert!(
        lines[0].contains("since=2025-11-30T01:22:15.056Z"),
        "{logged}"
    );
    assert!(
        lines[0].contains("last_error=\"connect: could not connect to the worker\""),
        "{logged}"
    );
    assert_eq!(
        engine.subscription_state("github"),
        Some(SubscriptionState::DeadLettered)
    );
    let listed = engine
        .subscriptions_in_state(SubscriptionState::DeadLettered)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state_since, 1_764_465_735_056);
}
