//! `GET /v1/runs/{runId}/events` (OpenWOP §12): the run's event log as Server-Sent Events. Each event is
//! `id: <sequence>`, `event: <type>`, `data: <RunEventDoc JSON>`. A reconnect with `Last-Event-ID: <n>`
//! resumes after sequence n. Keep-alive comments every 15 s; the stream ends after the terminal event.
//! `streamMode` must be one of `values, updates, messages, debug` (comma-mixable, except `values`);
//! every mode carries the same run events here. Errors: 400 `validation_error`, 404.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Deserialize;
use tb_core::ErrorCode;

use crate::error::ApiError;
use crate::{wire, AppState};

const TERMINAL: [&str; 3] = ["run.completed", "run.failed", "run.cancelled"];

/// Query of the SSE endpoint.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SseParams {
    pub stream_mode: Option<String>,
}

fn check_mode(mode: Option<&str>) -> Result<(), ApiError> {
    let Some(m) = mode else { return Ok(()) };
    let parts: Vec<&str> = m.split(',').map(str::trim).collect();
    let known = |p: &&str| ["values", "updates", "messages", "debug"].contains(p);
    if parts.is_empty()
        || !parts.iter().all(known)
        || (parts.len() > 1 && parts.contains(&"values"))
    {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "streamMode must be values, or a comma list of updates, messages, debug",
        ));
    }
    Ok(())
}

struct Cursor {
    st: AppState,
    run_id: String,
    after: Option<u64>,
    buffered: VecDeque<Event>,
    done: bool,
}

/// The handler.
#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "text/event-stream of RunEventDoc"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<SseParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = crate::error::query(q)?;
    check_mode(q.stream_mode.as_deref())?;
    crate::runs::load_run(&st, &id).await?;
    let after = match headers.get("last-event-id").and_then(|v| v.to_str().ok()) {
        Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
            ApiError::new(
                ErrorCode::ValidationError,
                "Last-Event-ID must be an event sequence number",
            )
        })?),
        None => None,
    };
    let cursor = Cursor {
        st,
        run_id: id,
        after,
        buffered: VecDeque::new(),
        done: false,
    };
    let s = stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(e) = c.buffered.pop_front() {
                return Some((Ok::<Event, Infallible>(e), c));
            }
            if c.done {
                return None;
            }
            match c.st.engine.store.run_events(&c.run_id, c.after, 500).await {
                Ok(evs) if !evs.is_empty() => {
                    for e in &evs {
                        c.after = Some(e.sequence);
                        c.done |= TERMINAL.contains(&e.event_type.as_str());
                        let data = wire::run_event(e).to_string();
                        c.buffered.push_back(
                            Event::default()
                                .id(e.sequence.to_string())
                                .event(e.event_type.clone())
                                .data(data),
                        );
                    }
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(_) => return None,
            }
        }
    });
    Ok(Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
