//! Helpers shared by the store's integration tests (`mod support;` in a test file; a file uses some).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::{AttemptReport, RunStart};
use tb_core::delivery::{AttemptDecision, DeliveryKind, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::run::RunStatus;
use tb_core::subscription::FailurePolicy;
use tb_core::subscription::Source;
use tokio::sync::Barrier;
use trigger_bridge_store::{
    AttemptCommit, Lease, LeaseRequest, NewDelivery, NewReceipt, Store, SubscriptionDef,
};

/// Creates (or updates) webhook subscription `id` (Standard Webhooks, no failure threshold) at 1 000.
pub async fn webhook_subscription(s: &dyn Store, id: &str) {
    s.upsert_subscription(
        SubscriptionDef {
            id: id.into(),
            source: Source::Webhook,
            connector: "standard-webhooks".into(),
            config: json!({}),
            failure_threshold: 0,
        },
        1_000,
    )
    .await
    .expect("subscription created");
}

/// How long one racing task may take before the test fails.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f(i)` for `i in 0..n` as `n` tasks that start together behind a barrier, so they really
/// race; returns their results in `i` order. Panics when a task panics or takes longer than 60 s.
pub async fn race<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let b = barrier.clone();
            let fut = f(i);
            tokio::spawn(async move {
                b.wait().await;
                fut.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        let r = tokio::time::timeout(LIMIT, t)
            .await
            .expect("a racing task took too long");
        out.push(r.expect("a racing task panicked"));
    }
    out
}

pub const IMMEDIATE: FailurePolicy = FailurePolicy {
    failure_window_ms: 0,
    dead_letter_after_ms: 0,
    dead_letter_min_failures: 1,
};

/// A receipt for dedup key `key` with one pending `start_run` delivery of `noop`, handed to worker
/// `w` at commit when `lease` is set; its delivery is created dead-lettered when `dead` is set.
pub fn receipt(key: &str, lease: bool, dead: bool) -> NewReceipt {
    NewReceipt {
        id: new_id(IdKind::Receipt),
        source: ReceiptSource::Webhook,
        subscription_id: "hooks".into(),
        dedup_key: key.into(),
        provider_event_id: key.into(),
        event_type: "thing.happened".into(),
        normalized: json!({"event": "thing.happened"}),
        state: ReceiptState::Routed,
        content_type: Some("application/json".into()),
        body: Bytes::from(format!("{{\"key\":\"{key}\"}}")),
        received_at: 2_000,
        dedup_until: 2_000 + 86_400_000,
        deliveries: vec![NewDelivery {
            id: new_id(IdKind::Delivery),
            kind: DeliveryKind::Binding,
            binding_id: "all".into(),
            action: "start_run".into(),
            workflow_id: Some("noop".into()),
            run_id: Some(new_id(IdKind::Run)),
            inputs: json!({"key": key}),
            params: None,
            state: if dead {
                DeliveryState::DeadLettered
            } else {
                DeliveryState::Pending
            },
            dead_letter_reason: dead.then(|| "subscription_dead_lettered".into()),
        }],
        capability: None,
        lease: lease.then(|| LeaseRequest {
            owner: "w".into(),
            lease_ms: 60_000,
            limit: 1,
        }),
        trace_context: None,
    }
}

/// The delivered attempt of `lease` (token `token`), starting its `noop` run completed.
pub fn delivered(lease: &Lease, token: &str) -> AttemptCommit {
    let run_id = lease.delivery.run_id.clone().expect("a start_run delivery");
    AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: token.into(),
                attempt: lease.delivery.attempts + 1,
            },
            event_id: new_id(IdKind::Event),
            decision: AttemptDecision::Delivered,
            failure: None,
            started_at: 3_000,
            duration_ms: 1,
            run: Some(RunStart {
                id: run_id,
                workflow_id: "noop".into(),
                inputs: lease.delivery.inputs.clone(),
                status: RunStatus::Completed,
                dead_letter: None,
                session: false,
            }),
            effect: None,
            failure_policy: IMMEDIATE,
        },
        effect: None,
        now: 3_000,
    }
}
