//! Wire shapes (camelCase JSON, RFC 3339 times) built from store records. Domain and store types never
//! reach the wire directly.

use serde_json::{json, Map, Value};
use tb_store::*;

pub use tb_api_types::inspect::{
    AttemptView, DeliveryDetail, DeliveryView, ReceiptDetail, ReceiptView,
};

/// Unix ms -> RFC 3339 with milliseconds, UTC (`2026-11-29T22:24:36.123Z`).
pub fn time(ms: i64) -> String {
    tb_engine::wire_event::time(ms)
}

fn put(m: &mut Map<String, Value>, k: &str, v: Option<Value>) {
    if let Some(v) = v {
        m.insert(k.into(), v);
    }
}

/// OpenWOP `TriggerSubscription` (closed object: `subscriptionId, source, state, dedupEnabled, retryPolicy,
/// secretFingerprint?`). Never a secret.
pub fn subscription(s: &SubscriptionRecord) -> Value {
    let rp = &s.config["retryPolicy"];
    let mut v = json!({
        "subscriptionId": s.id,
        "source": s.source.as_str(),
        "state": s.state.as_str(),
        "dedupEnabled": s.config["dedupEnabled"].as_bool().unwrap_or(true),
        "retryPolicy": {"maxAttempts": rp["max_attempts"], "backoff": rp["backoff"]},
    });
    if let Some(fp) = s.config["secretFingerprint"].as_str() {
        v["secretFingerprint"] = json!(fp);
    }
    v
}

/// Since when a subscription is in its state and how it is failing, kept beside the
/// OpenWOP `TriggerSubscription` object (whose schema is closed): `{stateSince, failuresSinceSuccess,
/// lastError?, lastSuccessAt?}`.
pub fn subscription_state_detail(s: &SubscriptionRecord) -> Value {
    let mut m = json!({
        "connector": s.connector,
        "failureThreshold": s.failure_threshold,
        "stateSince": time(s.state_since),
        "failuresSinceSuccess": s.consecutive_failures,
    });
    let o = m.as_object_mut().expect("object");
    put(o, "lastError", s.last_error.clone().map(Value::String));
    put(
        o,
        "lastSuccessAt",
        s.last_success_at.map(|t| Value::String(time(t))),
    );
    m
}

/// A receipt's wire view.
pub fn receipt_view(r: &ReceiptRecord) -> ReceiptView {
    ReceiptView {
        receipt_id: r.id.clone(),
        subscription_id: r.subscription_id.clone(),
        dedup_key: r.dedup_key.clone(),
        provider_event_id: r.provider_event_id.clone(),
        event_type: r.event_type.clone(),
        state: r.state.as_str().to_string(),
        body_bytes: r.body_bytes,
        received_at: time(r.received_at),
        updated_at: time(r.updated_at),
        duplicates: r.duplicates,
        content_type: r.content_type.clone(),
        last_duplicate_at: r.last_duplicate_at.map(time),
    }
}

/// A receipt as JSON ([`ReceiptView`]).
pub fn receipt(r: &ReceiptRecord) -> Value {
    serde_json::to_value(receipt_view(r)).expect("a plain struct")
}

/// A delivery's wire view.
pub fn delivery_view(d: &DeliveryRecord) -> DeliveryView {
    let state = tb_core::delivery::shown_state(d.state, d.lease_until, tb_engine::clock::now_ms());
    let in_flight = state == "in-flight";
    DeliveryView {
        delivery_id: d.id.clone(),
        receipt_id: d.receipt_id.clone(),
        subscription_id: d.subscription_id.clone(),
        binding_id: d.binding_id.clone(),
        dedup_key: d.dedup_key.clone(),
        action: d.action.clone(),
        state: state.to_string(),
        attempts: d.attempts,
        replays: d.replays,
        created_at: time(d.created_at),
        updated_at: time(d.updated_at),
        workflow_id: d.workflow_id.clone(),
        // A dead-lettered delivery started no run: show no run id.
        run_id: (d.state != tb_core::delivery::DeliveryState::DeadLettered)
            .then(|| d.run_id.clone())
            .flatten(),
        // A worker holds it: who, and until when (after that it is due again).
        lease_owner: in_flight.then(|| d.lease_owner.clone()).flatten(),
        lease_expires_at: in_flight.then(|| d.lease_until.map(time)).flatten(),
        next_attempt_at: (!in_flight && !d.state.is_terminal())
            .then(|| d.due_at.map(time))
            .flatten(),
        last_error: d.last_error.clone(),
        dead_letter_reason: d.dead_letter_reason.clone(),
        trace_context: d.trace_context.clone(),
    }
}

/// A delivery as JSON ([`DeliveryView`]).
pub fn delivery(d: &DeliveryRecord) -> Value {
    serde_json::to_value(delivery_view(d)).expect("a plain struct")
}

/// One attempt's wire view.
pub fn attempt_view(a: &AttemptRecord) -> AttemptView {
    AttemptView {
        attempt: a.attempt,
        event_id: a.event_id.clone(),
        outcome: a.outcome.as_str().to_string(),
        started_at: time(a.started_at),
        duration_ms: a.duration_ms,
        error_class: a.error_class.clone(),
        message: a.message.clone(),
        next_attempt_at: a.next_due_at.map(time),
    }
}

/// One attempt as JSON ([`AttemptView`]).
pub fn attempt(a: &AttemptRecord) -> Value {
    serde_json::to_value(attempt_view(a)).expect("a plain struct")
}

/// A run.
pub fn run(r: &RunRecord) -> Value {
    let mut m = json!({
        "runId": r.id,
        "workflowId": r.workflow_id,
        "status": r.status.as_str(),
        "inputs": r.inputs,
        "createdAt": time(r.created_at),
        "updatedAt": time(r.updated_at),
    });
    let o = m.as_object_mut().expect("object");
    put(o, "output", r.output.clone());
    put(o, "causationId", r.causation_id.clone().map(Value::String));
    put(o, "waitReason", r.wait_reason.clone().map(Value::String));
    if let (Some(s), Some(rc), Some(d)) = (&r.subscription_id, &r.receipt_id, &r.delivery_id) {
        o.insert(
            "trigger".into(),
            json!({"subscriptionId": s, "receiptId": rc, "deliveryId": d}),
        );
    }
    m
}

/// A run announced at ingest whose delivery has not started it yet: status `pending`, no events.
pub fn pending_run(d: &DeliveryRecord) -> Value {
    json!({
        "runId": d.run_id,
        "workflowId": d.workflow_id,
        "status": "pending",
        "inputs": d.inputs,
        "createdAt": time(d.created_at),
        "updatedAt": time(d.updated_at),
        "trigger": {"subscriptionId": d.subscription_id, "receiptId": d.receipt_id, "deliveryId": d.id},
    })
}

/// A run announced at ingest that will not start as things stand: its delivery was dead-lettered.
/// Shape: the [`pending_run`] fields with `status: "failed"`, `statusReason` (e.g. `dead_lettered`),
/// `deliveryId` and, when known, `deadLetterReason`. A replay of the delivery makes it `pending` again.
pub fn unstarted_run(d: &DeliveryRecord, reason: &str) -> Value {
    let mut m = pending_run(d);
    m["status"] = json!("failed");
    m["statusReason"] = json!(reason);
    m["deliveryId"] = json!(d.id);
    if let Some(r) = &d.dead_letter_reason {
        m["deadLetterReason"] = json!(r);
    }
    m
}

/// OpenWOP `RunEventDoc` (`eventId, runId, type, payload, timestamp, sequence, causationId?`).
pub fn run_event(e: &RunEventRecord) -> Value {
    tb_engine::wire_event::run_event_doc(e)
}

/// A run-less trigger event in the same envelope, without `runId`/`sequence`.
pub fn subscription_event(e: &SubscriptionEventRecord) -> Value {
    json!({"eventId": e.event_id, "type": e.event_type, "payload": e.payload, "timestamp": time(e.timestamp)})
}
