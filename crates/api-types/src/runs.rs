//! `POST /v1/runs` and `POST /v1/runs/{id}:fork`: the answer that names a new run.

use serde::{Deserialize, Serialize};

/// A run just accepted (201). `status` is `pending`: the delivery engine starts it (retried,
/// recorded) like a trigger run. `eventsUrl` and `statusUrl` are paths on the same server; a fork
/// names the ended run it copied in `forkedFrom`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunCreated {
    pub run_id: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    pub events_url: String,
    pub status_url: String,
}

impl RunCreated {
    /// The answer for run `run_id`, pending, with its two paths.
    pub fn pending(run_id: &str, forked_from: Option<String>) -> RunCreated {
        RunCreated {
            run_id: run_id.to_string(),
            status: "pending".into(),
            forked_from,
            events_url: format!("/v1/runs/{run_id}/events"),
            status_url: format!("/v1/runs/{run_id}"),
        }
    }
}
