//! Wire shapes (camelCase JSON, RFC 3339 times) built from store records. Domain and store types never
//! reach the wire directly.

use serde_json::{json, Map, Value};
use tb_store::*;

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

/// Since when a subscription is in its state and how it is failing (issue #9 defect 5), kept beside the
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

/// A receipt (no body, no headers).
pub fn receipt(r: &ReceiptRecord) -> Value {
    let mut m = json!({
        "receiptId": r.id,
        "subscriptionId": r.subscription_id,
        "dedupKey": r.dedup_key,
        "providerEventId": r.provider_event_id,
        "eventType": r.event_type,
        "state": r.state.as_str(),
        "bodyBytes": r.body_bytes,
        "receivedAt": time(r.received_at),
        "updatedAt": time(r.updated_at),
        "duplicates": r.duplicates,
    });
    let o = m.as_object_mut().expect("object");
    put(o, "contentType", r.content_type.clone().map(Value::String));
    put(
        o,
        "lastDuplicateAt",
        r.last_duplicate_at.map(|t| Value::String(time(t))),
    );
    m
}

/// A delivery. `state` is [`tb_core::delivery::shown_state`]: `in-flight` (with `leaseOwner` and
/// `leaseExpiresAt`, no `nextAttemptAt`) while a worker holds it, else the stored state.
pub fn delivery(d: &DeliveryRecord) -> Value {
    let state = tb_core::delivery::shown_state(d.state, d.lease_until, tb_engine::clock::now_ms());
    let mut m = json!({
        "deliveryId": d.id,
        "receiptId": d.receipt_id,
        "subscriptionId": d.subscription_id,
        "bindingId": d.binding_id,
        "dedupKey": d.dedup_key,
        "action": d.action,
        "state": state,
        "attempts": d.attempts,
        "replays": d.replays,
        "createdAt": time(d.created_at),
        "updatedAt": time(d.updated_at),
    });
    let o = m.as_object_mut().expect("object");
    put(o, "workflowId", d.workflow_id.clone().map(Value::String));
    // A dead-lettered delivery started no run: show no run id.
    if d.state != tb_core::delivery::DeliveryState::DeadLettered {
        put(o, "runId", d.run_id.clone().map(Value::String));
    }
    if state == "in-flight" {
        // A worker holds it: who, and until when (after that it is due again).
        put(o, "leaseOwner", d.lease_owner.clone().map(Value::String));
        put(
            o,
            "leaseExpiresAt",
            d.lease_until.map(|t| Value::String(time(t))),
        );
    } else if !d.state.is_terminal() {
        put(o, "nextAttemptAt", d.due_at.map(|t| Value::String(time(t))));
    }
    put(o, "lastError", d.last_error.clone().map(Value::String));
    put(
        o,
        "deadLetterReason",
        d.dead_letter_reason.clone().map(Value::String),
    );
    m
}

/// One attempt.
pub fn attempt(a: &AttemptRecord) -> Value {
    let mut m = json!({
        "attempt": a.attempt,
        "eventId": a.event_id,
        "outcome": a.outcome.as_str(),
        "startedAt": time(a.started_at),
        "durationMs": a.duration_ms,
    });
    let o = m.as_object_mut().expect("object");
    put(o, "errorClass", a.error_class.clone().map(Value::String));
    put(o, "message", a.message.clone().map(Value::String));
    put(
        o,
        "nextAttemptAt",
        a.next_due_at.map(|t| Value::String(time(t))),
    );
    m
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
