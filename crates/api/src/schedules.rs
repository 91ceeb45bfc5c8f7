//! `/v1/schedules`: create, list, read, preview, pause, resume and retire cron schedules.
//! A schedule is a `schedule` trigger subscription: `GET /v1/trigger-subscriptions` lists it too, and
//! its receipts, deliveries and runs are read there. Errors: 400 `validation_error` (a spec that does
//! not compile, an unknown workflow, a bad id or count), 404 `not_found`, 409 `conflict` (id taken).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::connector::ConnectorSpec;
use tb_core::schedule::{parse_instant, utc_rfc3339, MissedTicks, Overlap, Schedule, ScheduleSpec};
use tb_core::subscription::{Source, SubscriptionInput};
use tb_core::ErrorCode;
use tb_store::SubscriptionRecord;

use crate::error::ApiError;
use crate::AppState;

/// `POST /v1/schedules` body (closed). Times are RFC 3339; durations ms.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScheduleBody {
    /// Subscription id; minted (`sch_...`) when absent.
    pub id: Option<String>,
    /// 5 fields, or 6 with seconds first.
    pub cron: String,
    /// IANA zone (default `UTC`).
    pub timezone: Option<String>,
    /// The workflow every tick starts.
    pub workflow_id: String,
    pub jitter_ms: Option<u64>,
    pub start: Option<String>,
    pub end: Option<String>,
    pub grace_ms: Option<u64>,
    /// `skip` (default), `run_once`, `all`.
    #[schema(value_type = Option<String>)]
    pub missed: Option<MissedTicks>,
    pub catch_up_max: Option<u32>,
    /// `allow` (default), `skip`, `buffer_one`.
    #[schema(value_type = Option<String>)]
    pub overlap: Option<Overlap>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ValidationError, msg)
}

/// The schedule view: `{id, state, cron, timezone, jitterMs, start?, end?, graceMs, missed, catchUpMax,
/// overlap, workflowId?, origin: api|config, lastNominalTime?, missedTicks, bufferedTime?,
/// nextFireTime?}`.
async fn view(st: &AppState, rec: &SubscriptionRecord) -> Result<Value, ApiError> {
    let Ok(ConnectorSpec::Schedule(spec)) =
        serde_json::from_value::<ConnectorSpec>(rec.config["connector"].clone())
    else {
        return Err(ApiError::new(
            ErrorCode::Internal,
            "stored schedule has no spec",
        ));
    };
    let cursor = st.engine.store.schedule_cursor(&rec.id).await?;
    let mut v = json!({
        "id": rec.id,
        "state": rec.state.as_str(),
        "cron": spec.cron,
        "timezone": spec.timezone,
        "jitterMs": spec.jitter_ms,
        "graceMs": spec.grace_ms,
        "missed": spec.missed.as_str(),
        "catchUpMax": spec.catch_up_max,
        "overlap": spec.overlap.as_str(),
        "origin": if rec.config["registration"].is_object() { "api" } else { "config" },
        "missedTicks": cursor.as_ref().map(|c| c.cursor.missed_total).unwrap_or(0),
    });
    if let Some(s) = spec.start_ms {
        v["start"] = utc_rfc3339(s).into();
    }
    if let Some(e) = spec.end_ms {
        v["end"] = utc_rfc3339(e).into();
    }
    if let Some(w) = rec.config["registration"]["workflowId"].as_str() {
        v["workflowId"] = w.into();
    }
    let compiled = Schedule::new(spec.clone()).ok();
    if let Some(c) = &cursor {
        // The cursor's first value is an anchor (when the schedule was first seen), not a tick.
        if compiled
            .as_ref()
            .is_some_and(|s| s.is_tick(c.cursor.last_nominal_ms))
        {
            v["lastNominalTime"] = utc_rfc3339(c.cursor.last_nominal_ms).into();
        }
        if let Some(b) = c.cursor.buffered_ms {
            v["bufferedTime"] = utc_rfc3339(b).into();
        }
    }
    if let Some(s) = compiled {
        let after = cursor
            .map(|c| c.cursor.last_nominal_ms)
            .unwrap_or_else(tb_engine::clock::now_ms);
        if let Some(n) = s.next_after(after) {
            v["nextFireTime"] = utc_rfc3339(s.fire_at(&rec.id, n)).into();
        }
    }
    Ok(v)
}

/// A live (not retired) schedule's record. Errors: 404.
async fn schedule(st: &AppState, id: &str) -> Result<SubscriptionRecord, ApiError> {
    match st.engine.store.get_subscription(id).await {
        Ok(r) if r.source == Source::Schedule && r.config["retired"].as_bool() != Some(true) => {
            Ok(r)
        }
        Ok(_) | Err(tb_store::StoreError::NotFound { .. }) => {
            Err(ApiError::new(ErrorCode::NotFound, "no such schedule"))
        }
        Err(e) => Err(e.into()),
    }
}

/// `POST /v1/schedules` -> 201 `{schedule}`.
#[utoipa::path(post, path = "/v1/schedules", tag = "schedules", request_body = ScheduleBody, responses((status = 201, description = "{schedule}"), (status = 400, description = "validation_error"), (status = 409, description = "conflict: id taken"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden")))]
pub async fn create(
    State(st): State<AppState>,
    body: Result<Json<ScheduleBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(b) = body.map_err(|e| bad(format!("body is not a schedule: {}", e.body_text())))?;
    let d = ScheduleSpec::new(&b.cron);
    let instant = |what: &str, t: Option<String>| {
        t.map(|t| parse_instant(&t).map_err(|e| bad(format!("{what}: {e}"))))
            .transpose()
    };
    let spec = ScheduleSpec {
        cron: b.cron.trim().to_string(),
        timezone: b.timezone.unwrap_or(d.timezone),
        jitter_ms: b.jitter_ms.unwrap_or(0),
        start_ms: instant("start", b.start)?,
        end_ms: instant("end", b.end)?,
        grace_ms: b.grace_ms.unwrap_or(d.grace_ms),
        missed: b.missed.unwrap_or_default(),
        catch_up_max: b.catch_up_max.unwrap_or(d.catch_up_max),
        overlap: b.overlap.unwrap_or_default(),
    };
    let rec = tb_engine::schedules::create(&st.engine, b.id, spec, &b.workflow_id).await?;
    let v = view(&st, &rec).await?;
    Ok((StatusCode::CREATED, Json(json!({ "schedule": v }))).into_response())
}

/// `GET /v1/schedules` -> `{schedules: [schedule]}`, ordered by id.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules", responses((status = 200, description = "{schedules}"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden")))]
pub async fn list(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut out = Vec::new();
    for rec in st.engine.store.list_subscriptions().await? {
        if rec.source == Source::Schedule && rec.config["retired"].as_bool() != Some(true) {
            out.push(view(&st, &rec).await?);
        }
    }
    Ok(Json(json!({ "schedules": out })))
}

/// `GET /v1/schedules/{id}` -> `{schedule}`.
#[utoipa::path(get, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = String, Path, description = "Schedule id")), responses((status = 200, description = "{schedule}"), (status = 404, description = "not_found")))]
pub async fn get(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let rec = schedule(&st, &id).await?;
    Ok(Json(json!({ "schedule": view(&st, &rec).await? })))
}

/// `?count=N` of the preview (default 5, 1 ..= 100).
#[derive(Debug, Deserialize)]
pub struct NextQuery {
    pub count: Option<usize>,
}

/// `GET /v1/schedules/{id}/next?count=N` -> `{id, timezone, next: [{nominalTime, localTime,
/// fireTime}]}`: the next N ticks after now, in UTC and in the schedule's zone (`fireTime` includes
/// the jitter).
#[utoipa::path(get, path = "/v1/schedules/{id}/next", tag = "schedules", params(("id" = String, Path, description = "Schedule id"), ("count" = Option<usize>, Query, description = "1 ..= 100, default 5")), responses((status = 200, description = "{id, timezone, next}"), (status = 400, description = "validation_error"), (status = 404, description = "not_found")))]
pub async fn next(
    State(st): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<NextQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| bad(format!("count: {}", e.body_text())))?;
    let rec = schedule(&st, &id).await?;
    let Ok(ConnectorSpec::Schedule(spec)) =
        serde_json::from_value::<ConnectorSpec>(rec.config["connector"].clone())
    else {
        return Err(ApiError::new(
            ErrorCode::Internal,
            "stored schedule has no spec",
        ));
    };
    let s = Schedule::new(spec).map_err(|e| ApiError::new(ErrorCode::Internal, e))?;
    let now = tb_engine::clock::now_ms();
    let next = tb_engine::scheduler::preview(&s, now, q.count.unwrap_or(5))?
        .into_iter()
        .zip(s.upcoming(now, q.count.unwrap_or(5)))
        .map(|((utc, local), n)| {
            json!({"nominalTime": utc, "localTime": local, "fireTime": utc_rfc3339(s.fire_at(&id, n))})
        })
        .collect::<Vec<_>>();
    Ok(Json(
        json!({"id": id, "timezone": s.spec().timezone, "next": next}),
    ))
}

async fn operate(
    st: AppState,
    id: String,
    input: SubscriptionInput,
) -> Result<Json<Value>, ApiError> {
    let rec = schedule(&st, &id).await?;
    // Made through another replica moments ago: load it here first.
    tb_engine::schedules::ensure_loaded(&st.engine, &rec);
    st.engine.operate(&id, input).await?;
    let rec = schedule(&st, &id).await?;
    Ok(Json(json!({ "schedule": view(&st, &rec).await? })))
}

/// `POST /v1/schedules/{id}/pause` -> `{schedule}`: due ticks are skipped (counted) until resumed.
#[utoipa::path(post, path = "/v1/schedules/{id}/pause", tag = "schedules", params(("id" = String, Path, description = "Schedule id")), responses((status = 200, description = "{schedule}"), (status = 404, description = "not_found")))]
pub async fn pause(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    operate(st, id, SubscriptionInput::OperatorPause).await
}

/// `POST /v1/schedules/{id}/resume` -> `{schedule}`: fires from the next tick; nothing is caught up.
#[utoipa::path(post, path = "/v1/schedules/{id}/resume", tag = "schedules", params(("id" = String, Path, description = "Schedule id")), responses((status = 200, description = "{schedule}"), (status = 404, description = "not_found")))]
pub async fn resume(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    operate(st, id, SubscriptionInput::OperatorResume).await
}

/// `DELETE /v1/schedules/{id}` -> 204: retires a schedule made through the API (its history stays).
#[utoipa::path(delete, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = String, Path, description = "Schedule id")), responses((status = 204, description = "retired"), (status = 404, description = "not_found (or from the config file)")))]
pub async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    schedule(&st, &id).await?;
    tb_engine::schedules::retire(&st.engine, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
