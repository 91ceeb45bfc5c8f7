//! The query of the list endpoints (`/v1/receipts`, `/v1/deliveries`, `/v1/runs`).

use serde::{Deserialize, Serialize};

/// `limit` (1..=500, default 50), `before` (cursor: a previous page's `nextCursor`), `state`,
/// `subscription`, `from` / `to` (RFC 3339: created in that range, both inclusive), on receipts
/// `providerEventId` (the sender's delivery id, e.g. `X-GitHub-Delivery`), on runs `status` and
/// `workflow`. A parameter that does not apply to the list (or an unknown one) is 400, never ignored;
/// each is sent only when set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// Deliveries: `pending`, `retrying`, `delivered`, `dead-lettered`; receipts: their state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Runs: their status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscription: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(
        rename = "providerEventId",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_event_id: Option<String>,
    /// Runs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
}
