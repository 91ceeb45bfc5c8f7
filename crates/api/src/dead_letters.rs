//! `GET /v1/trigger-subscriptions/{id}/dead-letters` (RFC 0232, OpenWOP trigger-bridge §9): one page of a
//! subscription's dead-lettered deliveries, newest first, content-free. `limit` is clamped to
//! `maxPageSize` (never refused); `cursor` is opaque and bound to its subscription (another
//! subscription's cursor is 400 `validation_error`). Records older than `retentionDays` are not served.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::ErrorCode;
use tb_store::{DeadLetterQuery, DeadLetterRecord};

use crate::error::ApiError;
use crate::{wire, AppState};

const DAY_MS: i64 = 86_400_000;

/// Query: `limit` (default and maximum `maxPageSize`; any value is clamped, never refused), `cursor`.
#[derive(Debug, Deserialize)]
pub struct PageParams {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

fn bad_cursor() -> ApiError {
    ApiError::new(
        ErrorCode::ValidationError,
        "cursor is not valid for this subscription; start without one",
    )
}

/// Cursor: base64url of `{subscriptionId}\n{deadLetteredAt}\n{deliveryId}`.
fn encode_cursor(sub: &str, at: i64, id: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{sub}\n{at}\n{id}"))
}

fn decode_cursor(sub: &str, cursor: &str) -> Result<(i64, String), ApiError> {
    if cursor.len() > 2048 {
        return Err(bad_cursor());
    }
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad_cursor())?;
    let text = String::from_utf8(raw).map_err(|_| bad_cursor())?;
    let mut parts = text.splitn(3, '\n');
    let (Some(s), Some(at), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad_cursor());
    };
    if s != sub {
        return Err(bad_cursor());
    }
    Ok((at.parse().map_err(|_| bad_cursor())?, id.to_string()))
}

fn record(r: &DeadLetterRecord, retention_days: u32) -> Value {
    let reason = match r.reason.as_deref() {
        Some("verification_failed") => "verification_failed",
        _ => "retries_exhausted",
    };
    let mut v = json!({
        "subscriptionId": r.subscription_id,
        "attemptEventId": r.attempt_event_id,
        "attempt": {
            "subscriptionId": r.subscription_id,
            "dedupKey": r.dedup_key,
            "attempt": r.attempt,
            "outcome": "dead-lettered",
        },
        "reason": reason,
        "deadLetteredAt": wire::time(r.dead_lettered_at),
        "expiresAt": wire::time(r.dead_lettered_at + retention_days as i64 * DAY_MS),
    });
    if let Some(c) = &r.state_change {
        v["stateChange"] = c.clone();
    }
    v
}

/// The handler. Errors: 404 `not_found` (unknown subscription), 400 `validation_error` (bad cursor or query).
#[utoipa::path(get, path = "/v1/trigger-subscriptions/{id}/dead-letters", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "TriggerDeadLetterPage (RFC 0232)"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn list(
    State(st): State<AppState>,
    Path(id): Path<String>,
    p: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    st.engine.store.get_subscription(&id).await?;
    let max = st.host.dead_letter_max_page;
    // RFC 0232: limit is clamped to [1, maxPageSize], never refused; a non-number means the default.
    let limit = p
        .limit
        .as_deref()
        .and_then(|l| l.trim().parse::<f64>().ok())
        .filter(|l| l.is_finite())
        .map_or(max, |l| l.clamp(1.0, max as f64) as u32);
    let before = match p.cursor.as_deref() {
        Some(c) => Some(decode_cursor(&id, c)?),
        None => None,
    };
    let retention = st.host.dead_letter_retention_days;
    let q = DeadLetterQuery {
        subscription_id: id.clone(),
        limit: limit + 1,
        before,
        not_before: tb_engine::clock::now_ms() - retention as i64 * DAY_MS,
    };
    let mut rows = st.engine.store.dead_letters(q).await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let mut body =
        json!({"deliveries": rows.iter().map(|r| record(r, retention)).collect::<Vec<_>>()});
    if more {
        if let Some(last) = rows.last() {
            body["nextCursor"] =
                json!(encode_cursor(&id, last.dead_lettered_at, &last.delivery_id));
        }
    }
    Ok(Json(body))
}
