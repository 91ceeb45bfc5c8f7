//! The OpenWOP `RunEventDoc` JSON of a stored run event (`eventId, runId, type, payload, timestamp,
//! sequence, causationId?`), shared by the API and the outbound webhook body.

use serde_json::{json, Value};
use tb_store::RunEventRecord;

/// Unix ms -> RFC 3339 with milliseconds, UTC.
pub fn time(ms: i64) -> String {
    tb_store::rfc3339(ms)
}

/// The event as a `RunEventDoc`.
pub fn run_event_doc(e: &RunEventRecord) -> Value {
    let mut m = json!({
        "eventId": e.event_id,
        "runId": e.run_id,
        "type": e.event_type,
        "payload": e.payload,
        "timestamp": time(e.timestamp),
        "sequence": e.sequence,
    });
    if let Some(c) = &e.causation_id {
        m["causationId"] = json!(c);
    }
    m
}
