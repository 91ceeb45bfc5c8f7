//! The JSON shapes of the wire (spec §6), fields in emission order, with Go's `omitempty` where the
//! spec says so. Encode with [`crate::json::to_vec`] for Go's bytes.

use serde::{Deserialize, Serialize};

use crate::json::Raw;
use crate::time::WireTime;

fn is_empty(s: &str) -> bool {
    s.is_empty()
}

/// The envelope (10 fields, all always present): the `X-Triggers-*` headers as JSON, nested in a
/// DLQ entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Envelope {
    pub trace_id: String,
    pub span_id: String,
    pub traceparent: String,
    pub flow_run_id: String,
    pub flow_id: String,
    /// A string (OPEN-1: the header is one).
    pub flow_version: String,
    pub idempotency_key: String,
    pub source_node_id: String,
    /// Previous attempts.
    pub retry_count: i64,
    /// When the message was emitted; Go's zero time when unknown.
    pub emitted_at: WireTime,
}

/// A service's heartbeat (`triggers.v2.heartbeat`), every 5 s; the last one with `shutting_down`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Heartbeat {
    pub service: String,
    pub service_version: String,
    /// `sha256:<64 lowercase hex>`.
    pub manifest_hash: String,
    /// Process start (constant per process: it tells replicas apart).
    pub started_at: WireTime,
    pub now: WireTime,
    pub shutting_down: bool,
}

/// One execution's outcome (`triggers.v2.flow.events.<flow_id>`). No result field: outputs travel
/// through the flow graph.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompletionEvent {
    pub flow_run_id: String,
    pub flow_id: String,
    pub flow_version: String,
    pub node_id: String,
    pub node_type: String,
    pub service: String,
    pub started_at: WireTime,
    pub finished_at: WireTime,
    /// `ok` or `error` (OPEN-6).
    pub status: String,
    #[serde(skip_serializing_if = "is_empty")]
    pub error: String,
    #[serde(skip_serializing_if = "is_empty")]
    pub trace_id: String,
}

/// A dead letter (`triggers.v2.dlq.<service>.<action|kind>`): the full envelope and the original
/// body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DlqEntry {
    /// `action` for a handler that failed for good, else a category: `decode`, `unknown_action`,
    /// `envelope` (OPEN-7; the category is also the fallback subject's last token).
    pub kind: String,
    pub envelope: Envelope,
    /// The action input as received (compacted; a JSON string when it was not JSON).
    pub body: Raw,
    pub err_msg: String,
    pub occurred_at: WireTime,
}

impl DlqEntry {
    /// Its `Nats-Msg-Id`: `<idempotency_key>:dlq:<occurred_at Unix ns>`, the same for every publish
    /// retry of this entry (so JetStream collapses them).
    pub fn msg_id(&self) -> String {
        format!(
            "{}:dlq:{}",
            self.envelope.idempotency_key,
            self.occurred_at.unix_nanos()
        )
    }
}

/// One flow handed to a service (OPEN-4): its id, version and opaque graph.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowEnvelope {
    pub id: String,
    pub version: String,
    pub body: Raw,
}

/// The orchestrator's answer to a register: `flows` always present (`null` when none, errors
/// included).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegisterReply {
    #[serde(skip_serializing_if = "is_empty")]
    pub error: String,
    pub flows: Option<Vec<FlowEnvelope>>,
}
