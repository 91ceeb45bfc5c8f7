//! Receipts, deliveries and attempts as operators inspect them (`/v1/receipts`, `/v1/deliveries`).
//! Never a body, a header or a secret.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A receipt on the wire (no body, no headers): `GET /v1/receipts`, `/v1/receipts/{id}`. Read by the
/// CLI's tables and the console's receipt pages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReceiptView {
    pub receipt_id: String,
    pub subscription_id: String,
    pub dedup_key: String,
    /// The sender's delivery id (`X-GitHub-Delivery`, `webhook-id` ...).
    pub provider_event_id: String,
    pub event_type: String,
    /// A stored receipt state (`consumed`, `unmatched`, `dead_lettered` ...).
    pub state: String,
    /// Bytes of the raw body.
    pub body_bytes: u64,
    /// RFC 3339 UTC, ms.
    pub received_at: String,
    pub updated_at: String,
    /// Repeated deliveries of its dedup key answered as duplicates.
    pub duplicates: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_duplicate_at: Option<String>,
}

/// A delivery on the wire: `GET /v1/deliveries`, `/v1/deliveries/{id}`, a receipt's deliveries.
/// `state` is `tb_core::delivery::shown_state`: `in-flight` (with `leaseOwner` and
/// `leaseExpiresAt`, no `nextAttemptAt`) while a worker holds it, else the stored state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct DeliveryView {
    pub delivery_id: String,
    pub receipt_id: String,
    pub subscription_id: String,
    pub binding_id: String,
    pub dedup_key: String,
    /// `start_run`, `raise_signal`, `enqueue_prompt` ...
    pub action: String,
    /// `pending`, `in-flight`, `retrying`, `delivered`, `dead-lettered`.
    pub state: String,
    /// Attempts made so far.
    pub attempts: u32,
    /// Operator replays (each grants one more attempt).
    pub replays: u32,
    /// RFC 3339 UTC, ms.
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    /// The run it started or reached; absent while dead-lettered (no run was started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// The last attempt's error class (`http_500`, `timeout` ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_reason: Option<String>,
    /// The W3C `traceparent` of the span that received its event: each attempt's span
    /// links to it. Absent when nothing traced the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<String>,
}

/// One attempt on the wire: `GET /v1/deliveries/{id}`'s `attempts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    /// 1-based.
    pub attempt: u32,
    /// The `trigger.delivery.attempted` event's id (a run it started has it as `causationId`).
    pub event_id: String,
    /// `delivered`, `retrying`, `dead-lettered`, or `lost`: the attempt's lease lapsed with no outcome
    /// recorded and the delivery was leased again (error class `lease_expired`; it may have reached
    /// its target; `startedAt` is when the lease lapsed, `durationMs` 0).
    pub outcome: String,
    /// RFC 3339 UTC, ms.
    pub started_at: String,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_class: Option<String>,
    /// Short and sanitized (`HTTP 500: <first printable bytes>`); never a header, URL or secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
}

/// `GET /v1/receipts/{id}`: the receipt, its deliveries and its redacted timeline (states, ids, times;
/// `crate::timeline`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReceiptDetail {
    pub receipt: ReceiptView,
    pub deliveries: Vec<DeliveryView>,
    /// `[{at, state, ...}]` from `received` to its terminal state.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub timeline: Vec<Value>,
}

/// `GET /v1/deliveries/{id}`: the delivery and every attempt, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryDetail {
    pub delivery: DeliveryView,
    pub attempts: Vec<AttemptView>,
}
