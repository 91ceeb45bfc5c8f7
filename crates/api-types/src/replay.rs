//! `POST /v1/trigger-subscriptions/{id}/dead-letters:replay`: preview, then replay with `expect`.

use serde::{Deserialize, Serialize};

/// Which dead letters: received in `[from, to)` (RFC 3339, any offset) with this exact error class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplayFilter {
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub to: Option<String>,
    #[serde(default)]
    pub error_class: Option<String>,
}

/// The request. `dryRun` (default true) previews; a replay needs `dryRun: false` and `expect`, the
/// count the preview showed (409 `replay_count_changed` when it differs now). `limit` caps one batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplayRequest {
    #[serde(default)]
    pub filter: ReplayFilter,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// A delivery the replay passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReplaySkip {
    pub delivery_id: String,
    pub reason: String,
}

/// The answer: a preview (`dryRun: true`: `count`, `sample`, `limit`) or a replay (`dryRun: false`:
/// `replayed`, `deliveryIds`, `skipped`, `remaining`). `more`: another batch is left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReplayOutcome {
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Vec<ReplaySkip>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    pub more: bool,
    /// The filter as applied (times normalized to UTC).
    pub filter: ReplayFilter,
}
