//! A receipt's redacted timeline (DESIGN §4 Receipt; signals-and-connectors §6): `received ->
//! authenticated -> normalized -> matched -> routed -> queued -> consumed`, or where it stopped, built
//! from the stored receipt, its deliveries and their attempts. Ids, states and times only: no body, no
//! field values.

use serde_json::{json, Value};
use tb_core::delivery::{AttemptOutcome, DeliveryState};
use tb_core::receipt::ReceiptState;
use tb_store::{AttemptRecord, DeliveryRecord, ReceiptRecord};

use crate::wire::time;

fn step(state: &str, at: i64) -> Value {
    json!({"state": state, "at": time(at)})
}

/// The timeline, oldest first. Each entry is `{state, at, ...}`; attempts add `{deliveryId, attempt,
/// outcome, errorClass?}`; repeated deliveries of the same dedup key add `{state: "duplicate", at: the
/// last one, count}`.
pub fn timeline(
    r: &ReceiptRecord,
    deliveries: &[(DeliveryRecord, Vec<AttemptRecord>)],
) -> Vec<Value> {
    let mut out = progress(r, deliveries);
    if let (n @ 1.., Some(at)) = (r.duplicates, r.last_duplicate_at) {
        let mut d = step("duplicate", at);
        d["count"] = json!(n);
        out.push(d);
        // ISO-8601 UTC strings sort by time; the sort is stable, so equal times keep their order.
        out.sort_by(|a, b| a["at"].as_str().cmp(&b["at"].as_str()));
    }
    out
}

fn progress(r: &ReceiptRecord, deliveries: &[(DeliveryRecord, Vec<AttemptRecord>)]) -> Vec<Value> {
    let t0 = r.received_at;
    let mut out = vec![step("received", t0)];
    if r.state == ReceiptState::Rejected {
        out.push(step("rejected", r.updated_at));
        return out;
    }
    out.push(step("authenticated", t0));
    let mut n = step("normalized", t0);
    n["eventType"] = json!(r.event_type);
    out.push(n);
    if deliveries.is_empty() {
        out.push(step(r.state.as_str(), r.updated_at));
        return out;
    }
    let mut m = step("matched", t0);
    m["bindings"] = json!(deliveries
        .iter()
        .map(|(d, _)| d.binding_id.clone())
        .collect::<Vec<_>>());
    out.push(m);
    out.push(step("routed", t0));
    let mut queued_at = None;
    for (d, attempts) in deliveries {
        for a in attempts {
            let mut e = step("attempted", a.started_at);
            e["deliveryId"] = json!(d.id);
            e["attempt"] = json!(a.attempt);
            e["outcome"] = json!(a.outcome.as_str());
            if let Some(c) = &a.error_class {
                e["errorClass"] = json!(c);
            }
            out.push(e);
            if a.outcome == AttemptOutcome::Delivered {
                let at = a.started_at + a.duration_ms as i64;
                queued_at = Some(queued_at.map_or(at, |q: i64| q.max(at)));
            }
        }
    }
    let all_delivered = deliveries
        .iter()
        .all(|(d, _)| d.state == DeliveryState::Delivered);
    if let (true, Some(q)) = (all_delivered, queued_at) {
        out.push(step("queued", q));
    }
    match r.state {
        ReceiptState::Routed | ReceiptState::Queued => {}
        ReceiptState::Consumed => {
            let at = deliveries
                .iter()
                .filter_map(|(d, _)| d.consumed_at)
                .max()
                .unwrap_or(r.updated_at);
            out.push(step("consumed", at));
        }
        s => out.push(step(s.as_str(), r.updated_at)),
    }
    out
}
