//! Abuse quarantine and refusal counts for operators: `POST
//! /v1/trigger-subscriptions/{id}/quarantine` `{reason}`, `POST .../release`, `GET /v1/quarantines`, and
//! `GET /v1/trigger-subscriptions/{id}/ingress-counts?minutes=N` (what the subscription admitted and
//! refused, per UTC minute and outcome, summed over every replica).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::rate::{self, Scope};
use tb_core::{ErrorCode, TbError};
use tb_store::{IngressCountQuery, QuarantineRecord};

use crate::error::ApiError;
use crate::{wire, AppState};

/// A quarantine on the wire: `{subscriptionId, since (RFC 3339), reason, quarantinedBy}`
/// (`quarantinedBy`: the operator's key name, `null` for the automatic rule).
pub fn view(q: &QuarantineRecord) -> Value {
    json!({
        "subscriptionId": q.subscription_id,
        "since": wire::time(q.since),
        "reason": q.reason,
        "quarantinedBy": q.quarantined_by,
    })
}

/// Body of `POST .../quarantine`: `{"reason": "..."}` (1 to 500 bytes kept).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuarantineBody {
    pub reason: String,
}

/// `POST /v1/trigger-subscriptions/{id}/quarantine` `{reason}` -> 200 `{quarantine, created}`: from now on
/// every request to it is refused with 403 `subscription_quarantined` before its body is read, on every
/// replica within one configuration poll. `created: false` when it already was (the first quarantine
/// is kept). Errors: 400 `validation_error` (no or empty reason), 404 `not_found`.
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/quarantine", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Subscription id")), responses((status = 200, description = "{quarantine: {subscriptionId, since, reason, quarantinedBy}, created}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn quarantine(
    State(st): State<AppState>,
    Path(id): Path<String>,
    who: Option<axum::Extension<crate::auth::Principal>>,
    body: Result<Json<QuarantineBody>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| {
        TbError::new(
            ErrorCode::ValidationError,
            format!("send {{\"reason\": \"why\"}}: {}", e.body_text()),
        )
    })?;
    let by = who.map_or_else(|| "anonymous".to_string(), |p| p.0 .0.clone());
    let (q, created) = st.engine.quarantine(&id, &b.reason, Some(by)).await?;
    Ok(Json(json!({"quarantine": view(&q), "created": created})))
}

/// `POST /v1/trigger-subscriptions/{id}/release` -> 200 `{released}` (`false` when it was not
/// quarantined). Errors: 404 `not_found`.
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/release", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Subscription id")), responses((status = 200, description = "{released}"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn release(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let released = st.engine.release(&id).await?;
    Ok(Json(json!({"released": released})))
}

/// `GET /v1/quarantines` -> `{quarantines: [...]}` by subscription id.
#[utoipa::path(get, path = "/v1/quarantines", tag = "trigger-subscriptions", responses((status = 200, description = "{quarantines: [{subscriptionId, since, reason, quarantinedBy}]}"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden")))]
pub async fn list(State(st): State<AppState>) -> Json<Value> {
    let all: Vec<Value> = st.engine.quarantine_list().iter().map(view).collect();
    Json(json!({"quarantines": all}))
}

/// Query of `GET .../ingress-counts`: `minutes` (1 to 10 080, default 60): how far back.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CountsParams {
    pub minutes: Option<u32>,
}

/// `GET /v1/trigger-subscriptions/{id}/ingress-counts?minutes=60` -> `{subscriptionId, counts: [{minute
/// (RFC 3339 start), outcome, n}]}`, newest first: what rate limits admitted (`admitted`, when the
/// subscription has a limit) and every refusal (`rate_limited`, `signature_invalid`, `too_large`,
/// `headers_too_large`, `quarantined`, ...), flushed once a second by each replica. Errors: 400 for
/// `minutes` out of range, 404 for an unknown subscription.
#[utoipa::path(get, path = "/v1/trigger-subscriptions/{id}/ingress-counts", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Subscription id"), ("minutes" = Option<u32>, Query, description = "How far back, 1 to 10080 (default 60)")), responses((status = 200, description = "{subscriptionId, counts: [{minute, outcome, n}]}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn counts(
    State(st): State<AppState>,
    Path(id): Path<String>,
    p: Result<Query<CountsParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let minutes = p.minutes.unwrap_or(60);
    if !(1..=10_080).contains(&minutes) {
        return Err(TbError::new(
            ErrorCode::ValidationError,
            format!("minutes {minutes} is out of range; use 1 to 10080 (seven days)"),
        )
        .into());
    }
    if st.engine.catalog().subscription(&id).is_none() {
        return Err(TbError::new(ErrorCode::NotFound, "no such trigger subscription").into());
    }
    let now = rate::minute_of(tb_engine::clock::now_ms());
    let rows = st
        .engine
        .store
        .ingress_counts(IngressCountQuery {
            since_minute: now - i64::from(minutes) + 1,
            scope: Some(Scope::Subscription.as_str().into()),
            key: Some(id.clone()),
            limit: 10_000,
        })
        .await?;
    let counts: Vec<Value> = rows
        .iter()
        .map(|r| json!({"minute": wire::time(r.minute * rate::MINUTE_MS), "outcome": r.outcome, "n": r.n}))
        .collect();
    Ok(Json(json!({"subscriptionId": id, "counts": counts})))
}
