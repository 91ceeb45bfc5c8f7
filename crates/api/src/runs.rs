//! Runs: `GET /v1/runs`, `GET /v1/runs/{id}`, `GET /v1/runs/{id}/events/poll`, and the worker's
//! `POST /v1/runs/{id}/result`.

use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::run::{parse_result_status, RunStatus};
use tb_core::ErrorCode;

use crate::error::ApiError;
use crate::inspect::{page, ListParams};
use crate::{wire, AppState};

/// `GET /v1/runs` -> `{runs, nextCursor?}` (`status` filters). Errors: 400 for an unknown status.
pub async fn list_runs(
    State(st): State<AppState>,
    p: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let status = p.status.clone();
    let q = p.query(status, |s| RunStatus::parse(s).is_some(), "unknown run status; use pending, running, paused, waiting-approval, waiting-input, waiting-external, completed, failed, cancelling or cancelled")?;
    let limit = q.limit;
    let runs = st.engine.store.list_runs(q).await?;
    Ok(Json(page(
        "runs",
        runs.iter().map(wire::run).collect(),
        limit,
        "runId",
    )))
}

/// `GET /v1/runs/{id}` -> the run.
pub async fn get_run(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(wire::run(&st.engine.store.get_run(&id).await?)))
}

/// Query of the poll endpoint: events after `lastSequence` (all when absent); wait up to `timeout`
/// seconds (0..=30, default 0) for one to appear.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollParams {
    pub last_sequence: Option<u64>,
    pub timeout: Option<u64>,
    pub limit: Option<u32>,
}

/// `GET /v1/runs/{id}/events/poll` -> `{events: [RunEventDoc], isComplete}`.
pub async fn poll_events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    p: Result<Query<PollParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let run = st.engine.store.get_run(&id).await?;
    let deadline = Instant::now() + Duration::from_secs(p.timeout.unwrap_or(0).min(30));
    let limit = p.limit.unwrap_or(500).clamp(1, 1000);
    loop {
        let evs = st
            .engine
            .store
            .run_events(&id, p.last_sequence, limit)
            .await?;
        let done = evs.iter().any(|e| {
            e.event_type == "run.completed"
                || e.event_type == "run.failed"
                || e.event_type == "run.cancelled"
        });
        if !evs.is_empty() || Instant::now() >= deadline {
            let complete = done || (evs.is_empty() && run.status.is_terminal());
            return Ok(Json(
                json!({"events": evs.iter().map(wire::run_event).collect::<Vec<_>>(), "isComplete": complete}),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Body of `POST /v1/runs/{id}/result`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultBody {
    /// `completed`, `failed` or `cancelled`.
    pub status: String,
    pub output: Option<Value>,
}

/// `POST /v1/runs/{id}/result {status, output?}`: an http worker that answered 202 reports the end of
/// its run. Errors: 400 `validation_error` (bad body or non-terminal status), 404, 409 `conflict` (run
/// already terminal).
pub async fn post_result(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<ResultBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body.map_err(|e| {
        ApiError::new(
            ErrorCode::ValidationError,
            format!("invalid result body: {}", e.body_text()),
        )
    })?;
    let status = parse_result_status(&body.status)
        .map_err(|m| ApiError::new(ErrorCode::ValidationError, m))?;
    let run = st
        .engine
        .store
        .finish_run(&id, status, body.output, tb_engine::clock::now_ms())
        .await?;
    Ok(Json(wire::run(&run)))
}

/// `POST /v1/runs/{id}/cancel` -> the run, now `cancelled` with a `run.cancelled` event (its one terminal
/// event, last). Errors: 404; 409 `conflict` when the run already ended.
pub async fn cancel(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = st
        .engine
        .store
        .finish_run(&id, RunStatus::Cancelled, None, tb_engine::clock::now_ms())
        .await?;
    Ok(Json(wire::run(&run)))
}

/// `GET /v1/runs/{id}/ancestry` -> `{runId, hostId, parent}` (RFC 0040 §C). Runs here are started by
/// trigger deliveries, never dispatched by another run, so `parent` is `null`; the trigger link is
/// `run.started.causationId`. Errors: 404.
pub async fn ancestry(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = st.engine.store.get_run(&id).await?;
    Ok(Json(
        json!({"runId": run.id, "hostId": st.host.host_id, "parent": null}),
    ))
}
