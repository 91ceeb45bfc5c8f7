//! Read endpoints for operators: subscriptions (and pause / resume), receipts, deliveries.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde_json::{json, Value};
use tb_core::delivery::DeliveryState;
use tb_core::receipt::ReceiptState;
use tb_core::subscription::SubscriptionInput;
use tb_core::ErrorCode;
use tb_store::ListQuery;

use crate::error::ApiError;
use crate::{wire, AppState};

/// Query of list endpoints: the client's own shape (`tb_api_types::ListQuery`).
pub use tb_api_types::ListQuery as ListParams;

fn rfc3339_ms(field: &str, v: &str) -> Result<i64, ApiError> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|d| d.timestamp_millis())
        .map_err(|_| {
            ApiError::new(
                ErrorCode::ValidationError,
                format!("{field} must be an RFC 3339 time, e.g. 2026-12-01T09:00:00Z"),
            )
        })
}

/// The store query of a list's parameters `p`, with `filter` (the `state` or `status` value) checked
/// by `valid`; `hint` says which values exist. Errors: 400 `validation_error` (the value is never
/// echoed).
pub(crate) fn store_query(
    p: ListParams,
    kind: tb_core::ids::IdKind,
    filter: Option<String>,
    valid: impl Fn(&str) -> bool,
    hint: &str,
) -> Result<ListQuery, ApiError> {
    use tb_core::ids::IdKind;
    let misplaced: &[(&str, bool)] = match kind {
        IdKind::Receipt => &[
            ("status", p.status.is_some()),
            ("workflow", p.workflow.is_some()),
        ],
        IdKind::Delivery => &[
            ("status", p.status.is_some()),
            ("workflow", p.workflow.is_some()),
            ("providerEventId", p.provider_event_id.is_some()),
        ],
        _ => &[
            ("state", p.state.is_some()),
            ("providerEventId", p.provider_event_id.is_some()),
        ],
    };
    if let Some((name, _)) = misplaced.iter().find(|(_, set)| *set) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            format!("{name} does not apply to this list; see docs/http-api.md for its parameters"),
        ));
    }
    if filter.as_deref().is_some_and(|f| !valid(f)) {
        return Err(ApiError::new(ErrorCode::ValidationError, hint));
    }
    // A cursor is an id this API printed as `nextCursor`: `<prefix>_<32 hex>`.
    let cursor_ok = |c: &str| {
        c.split_once('_').is_some_and(|(p, hex)| {
            !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_lowercase())
                && hex.len() == 32
                && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
    };
    if p.before.as_deref().is_some_and(|c| !cursor_ok(c)) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "before must be a nextCursor value from a previous page",
        ));
    }
    let from = p
        .from
        .as_deref()
        .map(|v| rfc3339_ms("from", v))
        .transpose()?;
    let to = p.to.as_deref().map(|v| rfc3339_ms("to", v)).transpose()?;
    if let (Some(f), Some(t)) = (from, to) {
        if f > t {
            return Err(ApiError::new(
                ErrorCode::ValidationError,
                "from must not be after to",
            ));
        }
    }
    // `to` is inclusive: ids before the first one minted 1 ms later; the cursor may narrow it.
    let before = match (p.before, to) {
        (Some(b), Some(t)) => Some(b.min(tb_core::ids::floor(kind, t + 1))),
        (b, t) => b.or(t.map(|t| tb_core::ids::floor(kind, t + 1))),
    };
    Ok(ListQuery {
        limit: p.limit.unwrap_or(50).clamp(1, 500),
        before,
        state: filter,
        subscription_id: p.subscription,
        from_id: from.map(|f| tb_core::ids::floor(kind, f)),
        provider_event_id: p.provider_event_id.filter(|p| !p.is_empty()),
        workflow_id: p.workflow.filter(|w| !w.is_empty()),
    })
}

/// `{items..., nextCursor?}`: a cursor is given when the page is full.
pub(crate) fn page(key: &str, items: Vec<Value>, limit: u32, id_key: &str) -> Value {
    let mut body = json!({});
    if items.len() as u32 >= limit {
        if let Some(last) = items.last().and_then(|i| i[id_key].as_str()) {
            body["nextCursor"] = json!(last);
        }
    }
    body[key] = Value::Array(items);
    body
}

/// `GET /v1/trigger-subscriptions` -> `{subscriptions: [TriggerSubscription], stateDetails: {id:
/// {stateSince, failuresSinceSuccess, lastError?, lastSuccessAt?}}}`.
#[utoipa::path(get, path = "/v1/trigger-subscriptions", tag = "trigger-subscriptions", responses((status = 200, description = "{subscriptions: [TriggerSubscription], stateDetails: {id: {stateSince, failuresSinceSuccess, lastError?, lastSuccessAt?}}}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn list_subscriptions(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let subs = st.engine.store.list_subscriptions().await?;
    let details: serde_json::Map<String, Value> = subs
        .iter()
        .map(|s| (s.id.clone(), state_detail(&st, s)))
        .collect();
    Ok(Json(
        json!({"subscriptions": subs.iter().map(wire::subscription).collect::<Vec<_>>(), "stateDetails": details}),
    ))
}

/// `GET /v1/trigger-subscriptions/{id}` -> `{subscription, stateDetail: {stateSince,
/// failuresSinceSuccess, lastError?, lastSuccessAt?, quarantine?}}`.
#[utoipa::path(get, path = "/v1/trigger-subscriptions/{id}", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "{subscription, stateDetail}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn get_subscription(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let s = st.engine.store.get_subscription(&id).await?;
    Ok(Json(
        json!({"subscription": wire::subscription(&s), "stateDetail": state_detail(&st, &s)}),
    ))
}

/// [`wire::subscription_state_detail`] plus `quarantine` ([`crate::quarantine::view`]) while
/// quarantined and `previousSecretUntil` while a secret rotation lasts.
fn state_detail(st: &AppState, s: &tb_store::SubscriptionRecord) -> Value {
    let mut d = wire::subscription_state_detail(s);
    if let Some(q) = st.engine.quarantined(&s.id) {
        d["quarantine"] = crate::quarantine::view(&q);
    }
    // A secret rotation in force: until when the previous secret is accepted (never the secret).
    if let Some(p) = st
        .engine
        .catalog()
        .subscription(&s.id)
        .and_then(|c| c.previous_secret.clone())
        .filter(|p| tb_core::rotation::previous_accepted(p.until_ms, tb_engine::clock::now_ms()))
    {
        d["previousSecretUntil"] = wire::time(p.until_ms).into();
    }
    d
}

async fn operate(
    st: AppState,
    id: String,
    input: SubscriptionInput,
) -> Result<Json<Value>, ApiError> {
    st.engine.operate(&id, input).await?;
    get_subscription(State(st), Path(id)).await
}

/// `POST /v1/trigger-subscriptions/{id}/pause` -> `{subscription}` (emits `state.changed`, `operator-paused`).
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/pause", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "{subscription}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn pause_subscription(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    operate(st, id, SubscriptionInput::OperatorPause).await
}

/// `POST /v1/trigger-subscriptions/{id}/resume` -> `{subscription}`.
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/resume", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "{subscription}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn resume_subscription(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    operate(st, id, SubscriptionInput::OperatorResume).await
}

/// `GET /v1/receipts` -> `{receipts, nextCursor?}`. Errors: 400 for an unknown `state`.
#[utoipa::path(get, path = "/v1/receipts", tag = "receipts", responses((status = 200, description = "{receipts, nextCursor?}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn list_receipts(
    State(st): State<AppState>,
    p: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let state = p.state.clone();
    let hint = format!(
        "unknown receipt state; use one of {}",
        ReceiptState::STORED
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let q = store_query(
        p,
        tb_core::ids::IdKind::Receipt,
        state,
        |s| ReceiptState::parse_stored(s).is_some(),
        &hint,
    )?;
    let limit = q.limit;
    let rs = st.engine.store.list_receipts(q).await?;
    Ok(Json(page(
        "receipts",
        rs.iter().map(wire::receipt).collect(),
        limit,
        "receiptId",
    )))
}

/// `GET /v1/receipts/{id}` -> `{receipt, deliveries, timeline}`; the timeline is redacted (states, ids, times).
#[utoipa::path(get, path = "/v1/receipts/{id}", tag = "receipts", params(("id" = String, Path, description = "Resource id")), responses((status = 200, body = wire::ReceiptDetail), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn get_receipt(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<wire::ReceiptDetail>, ApiError> {
    let r = st.engine.store.get_receipt(&id).await?;
    let ds = st.engine.store.deliveries_of_receipt(&id).await?;
    let mut with_attempts = Vec::with_capacity(ds.len());
    for d in &ds {
        with_attempts.push((d.clone(), st.engine.store.attempts(&d.id).await?));
    }
    Ok(Json(wire::ReceiptDetail {
        receipt: wire::receipt_view(&r),
        deliveries: ds.iter().map(wire::delivery_view).collect(),
        timeline: crate::timeline::timeline(&r, &with_attempts),
    }))
}

/// `GET /v1/deliveries` -> `{deliveries, nextCursor?}`. Errors: 400 for an unknown `state`.
#[utoipa::path(get, path = "/v1/deliveries", tag = "deliveries", responses((status = 200, description = "{deliveries, nextCursor?}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn list_deliveries(
    State(st): State<AppState>,
    p: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let state = p.state.clone();
    let q = store_query(
        p,
        tb_core::ids::IdKind::Delivery,
        state,
        |s| DeliveryState::parse(s).is_some(),
        "unknown delivery state; use pending, retrying, delivered or dead-lettered",
    )?;
    let limit = q.limit;
    let ds = st.engine.store.list_deliveries(q).await?;
    Ok(Json(page(
        "deliveries",
        ds.iter().map(wire::delivery).collect(),
        limit,
        "deliveryId",
    )))
}

/// `GET /v1/deliveries/{id}` -> `{delivery, attempts}`.
#[utoipa::path(get, path = "/v1/deliveries/{id}", tag = "deliveries", params(("id" = String, Path, description = "Resource id")), responses((status = 200, body = wire::DeliveryDetail), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn get_delivery(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<wire::DeliveryDetail>, ApiError> {
    let d = st.engine.store.get_delivery(&id).await?;
    let a = st.engine.store.attempts(&id).await?;
    Ok(Json(wire::DeliveryDetail {
        delivery: wire::delivery_view(&d),
        attempts: a.iter().map(wire::attempt_view).collect(),
    }))
}

/// `POST /v1/deliveries/{id}/replay` -> `{delivery}`: puts a dead-lettered delivery back in the queue
/// (one more attempt; attempt numbers continue). Errors: 404; 409 `conflict` unless dead-lettered.
#[utoipa::path(post, path = "/v1/deliveries/{id}/replay", tag = "deliveries", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "{delivery}"), (status = 409, description = "conflict: not dead-lettered"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn replay_delivery(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let d = st
        .engine
        .store
        .replay_delivery(&id, tb_engine::clock::now_ms())
        .await?;
    tracing::info!(delivery = %d.id, attempts = d.attempts, replays = d.replays, "delivery replayed by operator");
    metrics::counter!("tb_dead_letter_replays_total", "mode" => "single").increment(1);
    st.engine.work_ready.notify_one();
    Ok(Json(json!({"delivery": wire::delivery(&d)})))
}

/// `GET /v1/receipts/{id}/redacted-body` (scope `operator:bodies`) -> `{receiptId, contentType,
/// bodyBytes, json: bool, redacted?}`: a JSON body with every credential- or contact-named value
/// and every credential of a listed shape in a text replaced (`tb_core::redact`,
/// `tb_core::credentials`); a body that is not JSON is not shown (`json: false`). Errors: 404
/// (no such receipt, or its body expired with the retention).
#[utoipa::path(get, path = "/v1/receipts/{id}/redacted-body", tag = "receipts", params(("id" = String, Path, description = "Receipt id")), responses((status = 200, description = "{receiptId, contentType, bodyBytes, json, redacted?}"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn redacted_body(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let r = st.engine.store.get_receipt(&id).await?;
    let body = st.engine.store.get_body(&id).await?;
    let mut out = json!({
        "receiptId": r.id,
        "contentType": r.content_type,
        "bodyBytes": body.len(),
        "json": false,
    });
    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
        out["json"] = json!(true);
        out["redacted"] = tb_core::redact::json(&v);
    }
    Ok(Json(out))
}
