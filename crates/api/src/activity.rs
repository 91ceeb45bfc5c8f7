//! `GET /v1/activity`: what happened in the last `minutes` (default 60, at most 1440),
//! per subscription and minute, and the queue now. The console's overview and its sparklines read it.
//!
//! Cost: two grouped range scans over time-ordered primary keys (receipts, attempts) and a few indexed
//! counts; the console caches the answer per replica, so viewers do not multiply it.

use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use tb_core::ErrorCode;

use crate::error::ApiError;
use crate::wire::time;
use crate::AppState;

/// Query of `GET /v1/activity`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ActivityParams {
    /// The window, in minutes (1..=1440, default 60).
    pub minutes: Option<u32>,
}

/// One subscription's window.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionActivity {
    pub subscription_id: String,
    /// Receipts in the window.
    pub receipts: u64,
    /// Receipts per minute, oldest first (`minutes` entries).
    pub receipts_per_minute: Vec<u64>,
    /// Attempts in the window, and those that did not deliver.
    pub attempts: u64,
    pub failed_attempts: u64,
    /// Failed attempts per minute, oldest first.
    pub failures_per_minute: Vec<u64>,
    /// `failed_attempts / attempts` (0 when there was no attempt).
    pub failure_rate: f64,
}

/// The answer of `GET /v1/activity`.
#[derive(Debug, Default, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    /// Start of the window (RFC 3339 UTC).
    pub since: String,
    pub minutes: u32,
    /// Receipts in the window by their state now (`consumed`, `unmatched`, `dead_lettered` ...).
    pub receipts_by_state: BTreeMap<String, u64>,
    /// Attempts in the window by outcome (`delivered`, `retrying`, `dead-lettered`, `lost`).
    pub attempts_by_outcome: BTreeMap<String, u64>,
    /// Deliveries now waiting for their first attempt, waiting to be retried, dead-lettered.
    pub pending: u64,
    pub retrying: u64,
    pub dead_lettered: u64,
    /// Age (ms) of the oldest delivery still pending or retrying.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_undelivered_age_ms: Option<i64>,
    /// Waits armed now, and the nearest deadline.
    pub waits_armed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_deadline: Option<String>,
    /// Per subscription (every configured one, quiet ones with zeros), by id.
    pub subscriptions: Vec<SubscriptionActivity>,
}

/// Folds the store's grouped rows into the answer (pure; `ids` are every subscription to list).
pub fn fold(
    a: &tb_store::Activity,
    ids: &[String],
    since: i64,
    minutes: u32,
    now: i64,
) -> Activity {
    let n = minutes as usize;
    let mut subs: BTreeMap<String, SubscriptionActivity> = ids
        .iter()
        .map(|id| {
            (
                id.clone(),
                SubscriptionActivity {
                    subscription_id: id.clone(),
                    receipts_per_minute: vec![0; n],
                    failures_per_minute: vec![0; n],
                    ..Default::default()
                },
            )
        })
        .collect();
    let mut out = Activity {
        since: time(since),
        minutes,
        pending: a.queue.pending,
        retrying: a.queue.retrying,
        dead_lettered: a.queue.dead_lettered,
        oldest_undelivered_age_ms: a.oldest_undelivered_at.map(|t| (now - t).max(0)),
        waits_armed: a.waits_armed,
        next_deadline: a.next_deadline.map(time),
        ..Default::default()
    };
    let slot = |m: i64| (m.clamp(0, n as i64 - 1)) as usize;
    for (sub, state, minute, count) in &a.receipts {
        *out.receipts_by_state.entry(state.clone()).or_default() += count;
        if let Some(s) = subs.get_mut(sub) {
            s.receipts += count;
            s.receipts_per_minute[slot(*minute)] += count;
        }
    }
    for (sub, outcome, minute, count) in &a.attempts {
        *out.attempts_by_outcome.entry(outcome.clone()).or_default() += count;
        if let Some(s) = subs.get_mut(sub) {
            s.attempts += count;
            if outcome != "delivered" {
                s.failed_attempts += count;
                s.failures_per_minute[slot(*minute)] += count;
            }
        }
    }
    for s in subs.values_mut() {
        if s.attempts > 0 {
            s.failure_rate = s.failed_attempts as f64 / s.attempts as f64;
        }
    }
    out.subscriptions = subs.into_values().collect();
    out
}

/// Reads the activity of the last `minutes` (shared by the API and the console).
pub async fn load(st: &AppState, minutes: Option<u32>) -> Result<Activity, ApiError> {
    let minutes = minutes.unwrap_or(60);
    if !(1..=1440).contains(&minutes) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "minutes must be 1..=1440",
        ));
    }
    let now = tb_engine::clock::now_ms();
    let since = now - i64::from(minutes) * 60_000;
    let a = st.engine.store.activity(since).await?;
    let ids: Vec<String> = st
        .engine
        .store
        .list_subscriptions()
        .await?
        .into_iter()
        .map(|s| s.id)
        .collect();
    Ok(fold(&a, &ids, since, minutes, now))
}

/// `GET /v1/activity?minutes=60` -> [`Activity`]. Errors: 400 `validation_error` (minutes out of
/// range, unknown parameter).
#[utoipa::path(get, path = "/v1/activity", tag = "activity", params(ActivityParams), responses((status = 200, body = Activity), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden")))]
pub async fn activity(
    State(st): State<AppState>,
    q: Result<Query<ActivityParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Activity>, ApiError> {
    let p = crate::error::query(q)?;
    Ok(Json(load(&st, p.minutes).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fold_into_minutes_and_rates() {
        let a = tb_store::Activity {
            receipts: vec![
                ("gh".into(), "consumed".into(), 0, 2),
                ("gh".into(), "consumed".into(), 59, 3),
                ("gh".into(), "unmatched".into(), 61, 1),
                ("gone".into(), "consumed".into(), 5, 7),
            ],
            attempts: vec![
                ("gh".into(), "delivered".into(), 0, 3),
                ("gh".into(), "retrying".into(), 10, 1),
            ],
            oldest_undelivered_at: Some(1_000),
            ..Default::default()
        };
        let out = fold(&a, &["gh".into(), "quiet".into()], 0, 60, 5_000);
        assert_eq!(out.subscriptions.len(), 2);
        let gh = &out.subscriptions[0];
        assert_eq!(gh.receipts, 6);
        assert_eq!(gh.receipts_per_minute[0], 2);
        assert_eq!(
            gh.receipts_per_minute[59], 4,
            "a late row lands in the last minute"
        );
        assert_eq!((gh.attempts, gh.failed_attempts), (4, 1));
        assert_eq!(gh.failures_per_minute[10], 1);
        assert!((gh.failure_rate - 0.25).abs() < 1e-9);
        assert_eq!(out.subscriptions[1].receipts_per_minute, vec![0; 60]);
        assert_eq!(
            out.receipts_by_state["consumed"], 12,
            "totals count every subscription"
        );
        assert_eq!(out.oldest_undelivered_age_ms, Some(4_000));
    }
}
