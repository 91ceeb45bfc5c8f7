//! Runs: `GET /v1/runs`, `GET /v1/runs/{id}`, `GET /v1/runs/{id}/events/poll`, and the worker's
//! `POST /v1/runs/{id}/result` with its guard ([`require_executor`]).

use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, RawPathParams, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use axum::RequestPartsExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::run::{parse_result_status, RunStatus};
use tb_core::ErrorCode;
use tb_store::RecordKind;

use crate::auth::Access;
use crate::error::ApiError;
use crate::inspect::{page, store_query, ListParams};
use crate::{wire, AppState};

/// `GET /v1/runs` -> `{runs, nextCursor?}` (`status` filters). Errors: 400 for an unknown status.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", responses((status = 200, description = "{runs, nextCursor?}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn list_runs(
    State(st): State<AppState>,
    p: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let status = p.status.clone();
    let q = store_query(p, tb_core::ids::IdKind::Run, status, |s| RunStatus::parse(s).is_some(), "unknown run status; use pending, running, paused, waiting-approval, waiting-input, waiting-external, completed, failed, cancelling or cancelled")?;
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
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "The run"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn get_run(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(load_run(&st, &id).await?.0))
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
#[utoipa::path(get, path = "/v1/runs/{id}/events/poll", tag = "runs", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "{events: [RunEventDoc], isComplete}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn poll_events(
    State(st): State<AppState>,
    Path(id): Path<String>,
    p: Result<Query<PollParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let p = crate::error::query(p)?;
    let (_, terminal) = load_run(&st, &id).await?;
    // Without lastSequence the whole log is returned at once; with it, wait up to `timeout` s
    // (default 30, at most 60) for a newer event (OpenWOP §12).
    let wait = if p.last_sequence.is_some() {
        p.timeout.unwrap_or(30).min(60)
    } else {
        p.timeout.unwrap_or(0).min(60)
    };
    let deadline = Instant::now() + Duration::from_secs(wait);
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
            let complete = done || (evs.is_empty() && terminal);
            return Ok(Json(
                json!({"events": evs.iter().map(wire::run_event).collect::<Vec<_>>(), "isComplete": complete}),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Body of `POST /v1/runs/{id}/result`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultBody {
    /// `completed`, `failed` or `cancelled`.
    pub status: String,
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

/// `POST /v1/runs/{id}/result {status, output?}`: an http worker that answered 202 reports the end of
/// its run, as its executor ([`require_executor`]). Errors: 400 `validation_error` (bad body or
/// non-terminal status), 404, 409 `conflict` (run already terminal).
#[utoipa::path(post, path = "/v1/runs/{id}/result", tag = "runs", params(("id" = String, Path, description = "Resource id")), request_body = ResultBody, responses((status = 200, description = "The run"), (status = 409, description = "conflict"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn post_result(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<ResultBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = crate::error::json_body(
        body,
        "{\"status\": \"completed\"|\"failed\"|\"cancelled\", \"output\"?: any}",
    )?;
    let status = parse_result_status(&body.status)
        .map_err(|m| ApiError::new(ErrorCode::ValidationError, m))?;
    let run = tb_engine::runs::finish(&st.engine, &id, status, body.output).await?;
    Ok(Json(wire::run(&run)))
}

/// The guard of `POST /v1/runs/{id}/result` ([`crate::auth::Access::RunExecutor`]): only the run's
/// executor ends a run by reporting its result (a session agent's `runs:create` + `runs:read` key
/// does not: it may not cancel either). docs/http-api.md, "Reporting a run's result".
///
/// First, before anything is read or looked up, the wrong-key throttle
/// ([`tb_engine::Engine::admit_key_check`]): an address past `[rate_limits].failed_keys_per_min` gets
/// 429 `rate_limited` for any bearer, a right result token or key too (docs/limits.md, "Wrong API
/// keys"). Then:
///
/// - `Authorization: Bearer tbres_...` that is the run's [`tb_core::run::result_token`] (the http
///   executor sends it in the run's start request; only a holder of the workflow's key can make it):
///   the report goes on, actor `result-token`.
/// - A token-shaped bearer that is not the run's (another run's, a stale one after the workflow's
///   secret changed, a made-up one) and is no configured key: 401 `unauthenticated`, counted as a
///   wrong key (surface `result_token` of `tb_auth_failures_total`, and its `warn` line) and logged at
///   `info` with the run id; not recorded in the audit log, so guessing cannot fill it.
/// - Any other bearer value is checked as an API key by [`crate::auth::require`]: a key holding
///   [`crate::auth::RESULT_SCOPE`] goes on; a key without it is 403 `forbidden`; an unknown one is
///   401 (counted as a wrong key, not recorded).
/// - On an open API (no keys) the caller is `anonymous` with every scope.
///
/// Recorded in the audit log as `action` (`run.result`: actor, the run id, the outcome,
/// `detail.reported` = the terminal status asked for): every report made with a valid credential,
/// accepted or refused (403 for a key without the scope, 409, 404, 413 `payload_too_large` for a body
/// over [`crate::MAX_API_BODY`], ...). Not recorded: no credential, an unknown key or result token,
/// the 429 of the throttle, a store error while checking a token.
pub async fn require_executor(
    State((st, action)): State<(AppState, &'static str)>,
    req: Request,
    next: Next,
) -> Response {
    use axum::extract::ConnectInfo;
    use tb_core::run::RESULT_TOKEN_PREFIX;
    use tb_engine::failed_auth::Surface;
    let executor = (st.clone(), Access::RunExecutor);
    let (mut parts, body) = req.into_parts();
    let run_id = match parts.extract::<RawPathParams>().await {
        Ok(p) => p
            .iter()
            .map(|(_, v)| v.to_string())
            .next()
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    let presented = crate::auth::bearer(&parts.headers).map(str::to_string);
    // (the actor to record, whether it is the run's result token)
    let (actor, by_token) = if st.keys.0.is_empty() {
        ("anonymous".to_string(), false)
    } else {
        let Some(presented) = presented else {
            // 401, as on every guarded route: no credential, nobody to record.
            let req = Request::from_parts(parts, body);
            return crate::auth::require(State(executor), req, next).await;
        };
        let token_shaped = presented.starts_with(RESULT_TOKEN_PREFIX);
        let surface = if token_shaped {
            Surface::ResultToken
        } else {
            Surface::Api
        };
        // The throttle before the token is looked at or the body read (docs/limits.md).
        let peer = parts
            .extensions
            .get::<ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip());
        let client = st.engine.client_key(peer, &parts.headers);
        if let Err(retry_after_s) = st.engine.admit_key_check(client.as_deref(), surface) {
            return crate::auth::throttled(retry_after_s);
        }
        let known = crate::auth::known_key(&st.keys, &presented).map(|k| k.name.clone());
        match (token_shaped, known) {
            (_, Some(name)) => (name, false),
            (false, None) => {
                // An unknown key: require counts it and answers 401.
                let req = Request::from_parts(parts, body);
                return crate::auth::require(State(executor), req, next).await;
            }
            (true, None) => match executor_token(&st, &run_id, &presented).await {
                Ok(true) => ("result-token".to_string(), true),
                Ok(false) => {
                    st.engine.key_check_failed(client.as_deref(), surface);
                    tracing::info!(
                        run = ?run_id,
                        client = client.as_deref().unwrap_or("-"),
                        "run result refused: the result token is not this run's"
                    );
                    return crate::auth::deny(
                        axum::http::StatusCode::UNAUTHORIZED,
                        "unauthenticated",
                        "unknown API key or result token",
                    );
                }
                Err(e) => return e.into_response(),
            },
        }
    };
    let (res, reported) = match axum::body::to_bytes(body, crate::MAX_API_BODY).await {
        Err(_) => (
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the body is over the API's {} bytes", crate::MAX_API_BODY),
            )
            .into_response(),
            None,
        ),
        Ok(bytes) => {
            // Only a terminal status the handler would accept is named; nothing else of the body.
            let reported = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["status"].as_str().map(parse_result_status))
                .and_then(Result::ok)
                .map(RunStatus::as_str);
            let mut req = Request::from_parts(parts, axum::body::Body::from(bytes));
            let res = if by_token {
                req.extensions_mut().insert(crate::auth::Principal(
                    actor.clone(),
                    vec![crate::auth::RESULT_SCOPE.into()],
                ));
                next.run(req).await
            } else {
                crate::auth::require(State(executor), req, next).await
            };
            (res, reported)
        }
    };
    if res.status() == axum::http::StatusCode::TOO_MANY_REQUESTS {
        return res;
    }
    let extra = json!({ "reported": reported });
    crate::audit::record_answer(&st, &actor, action, run_id, res, Some(extra)).await
}

/// Whether `token` is run `run_id`'s result token: the run's workflow (from the run, or from its
/// delivery while the run is not recorded yet) is an `http` workflow and the token is
/// [`tb_core::run::result_token`] of its key. Errors: the store's, other than not-found.
async fn executor_token(st: &AppState, run_id: &str, token: &str) -> Result<bool, ApiError> {
    let workflow_id = match st.engine.store.get_run(run_id).await {
        Ok(r) => Some(r.workflow_id),
        Err(tb_store::StoreError::NotFound { .. }) => {
            match tb_core::ids::delivery_id_for_run(run_id) {
                None => None,
                Some(did) => match st.engine.store.get_delivery(&did).await {
                    Ok(d) if d.run_id.as_deref() == Some(run_id) => d.workflow_id,
                    Ok(_) | Err(tb_store::StoreError::NotFound { .. }) => None,
                    Err(e) => return Err(e.into()),
                },
            }
        }
        Err(e) => return Err(e.into()),
    };
    let catalog = st.engine.catalog();
    Ok(
        match workflow_id.as_deref().and_then(|w| catalog.workflow(w)) {
            Some(tb_core::workflow::Workflow {
                executor: tb_core::workflow::Executor::Http { secret, .. },
                ..
            }) => tb_core::run::result_token_matches(secret, run_id, token),
            _ => false,
        },
    )
}

/// `POST /v1/runs/{id}/cancel` -> the run, now `cancelled` with a `run.cancelled` event (its one terminal
/// event, last). Errors: 404; 409 `conflict` when the run already ended.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "The run, cancelled"), (status = 409, description = "conflict"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn cancel(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (_, ended) = load_run(&st, &id).await?;
    let run =
        match tb_engine::runs::finish(&st.engine, &id, RunStatus::Cancelled, None).await {
            Err(tb_store::StoreError::NotFound {
                kind: RecordKind::Run,
            }) if ended => return Err(ApiError::new(
                ErrorCode::Conflict,
                "the run never started: its delivery is dead-lettered (replay it to start the run)",
            )),
            Err(tb_store::StoreError::NotFound {
                kind: RecordKind::Run,
            }) => {
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    "the run has not started yet; retry the cancel shortly",
                ))
            }
            r => r?,
        };
    Ok(Json(wire::run(&run)))
}

/// `GET /v1/runs/{id}/ancestry` -> `{runId, hostId, parent}` (RFC 0040 §C). Runs here are started by
/// trigger deliveries, never dispatched by another run, so `parent` is `null`; the trigger link is
/// `run.started.causationId`. Errors: 404.
#[utoipa::path(get, path = "/v1/runs/{id}/ancestry", tag = "runs", params(("id" = String, Path, description = "Resource id")), responses((status = 200, description = "{runId, hostId, parent}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn ancestry(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    load_run(&st, &id).await?;
    Ok(Json(
        json!({"runId": id, "hostId": st.host.host_id, "parent": null}),
    ))
}

/// A run as the API shows it, and whether it has ended. A run announced at ingest (its `runId` is in the
/// 202) exists from that moment: until its delivery starts it, it reads from its delivery
/// ([`tb_core::run::announced_run`]): `pending`, or `failed` with `statusReason: "dead_lettered"` and
/// its `deliveryId` once that delivery is dead-lettered (and `pending` again after a replay).
/// Errors: 404 when neither a run nor a `start_run` delivery has this id.
pub(crate) async fn load_run(st: &AppState, id: &str) -> Result<(Value, bool), ApiError> {
    use tb_core::run::{announced_run, AnnouncedRun};
    match st.engine.store.get_run(id).await {
        Ok(r) => Ok((wire::run(&r), r.status.is_terminal())),
        Err(tb_store::StoreError::NotFound {
            kind: RecordKind::Run,
        }) => {
            let not_found = || ApiError::new(ErrorCode::NotFound, "run not found");
            let did = tb_core::ids::delivery_id_for_run(id).ok_or_else(not_found)?;
            let d = match st.engine.store.get_delivery(&did).await {
                Ok(d) if d.run_id.as_deref() == Some(id) => d,
                Ok(_)
                | Err(tb_store::StoreError::NotFound {
                    kind: RecordKind::Delivery,
                }) => return Err(not_found()),
                Err(e) => return Err(e.into()),
            };
            match announced_run(d.state) {
                AnnouncedRun::Pending => Ok((wire::pending_run(&d), false)),
                AnnouncedRun::Failed { reason } => Ok((wire::unstarted_run(&d, reason), true)),
                // Delivered between the two reads: the run exists now.
                AnnouncedRun::Started => {
                    let r = st.engine.store.get_run(id).await?;
                    Ok((wire::run(&r), r.status.is_terminal()))
                }
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Body of `POST /v1/runs` (OpenWOP §12; closed).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CreateRunBody {
    pub workflow_id: String,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub inputs: Option<Value>,
    pub tenant_id: Option<String>,
    pub scope_id: Option<String>,
    pub callback_url: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub configurable: Option<Value>,
    pub tags: Option<Vec<String>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

/// `POST /v1/runs` -> 201 `{runId, status: "pending", eventsUrl, statusUrl}`. The run is started by the
/// delivery engine (retried, recorded) like a trigger run; `Idempotency-Key` is honoured by the
/// idempotency layer. Errors: 400 `validation_error` (body), 404 `not_found` (workflow).
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRunBody, responses((status = 201, description = "{runId, status, eventsUrl, statusUrl}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn create(
    State(st): State<AppState>,
    headers: axum::http::HeaderMap,
    body: bytes::Bytes,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    // The inputs are handed back in every run view and start turn, nested deeper there: a body is
    // held to the ingest defaults (depth 64, docs/limits.md) so every reader can parse what it gets.
    use tb_core::limits::{check_json, JsonLimits, JsonRefusal};
    check_json(&body, &JsonLimits::default()).map_err(|r| match r {
        JsonRefusal::Exceeded(e) => ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the body is over the API's {} limit (docs/limits.md)",
                e.key()
            ),
        ),
        JsonRefusal::InvalidUtf8 => {
            ApiError::new(ErrorCode::ValidationError, "the body is not UTF-8")
        }
    })?;
    let b: CreateRunBody = serde_json::from_slice(&body).map_err(|_| {
        ApiError::new(ErrorCode::ValidationError, "body must be {workflowId, inputs?, tenantId?, scopeId?, callbackUrl?, configurable?, tags?, metadata?}")
    })?;
    let inputs = b.inputs.unwrap_or_else(|| json!({}));
    if !inputs.is_object() {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "inputs must be an object",
        ));
    }
    // A caller's trace continues into the run's receipt span.
    let run_id = tb_engine::runs::start_traced(
        &st.engine,
        &b.workflow_id,
        inputs,
        tb_engine::trace::from_headers(&headers),
    )
    .await?;
    let reply = tb_api_types::RunCreated::pending(&run_id, None);
    Ok((axum::http::StatusCode::CREATED, Json(reply)).into_response())
}

#[utoipa::path(post, path = "/v1/runs/{id}:fork", tag = "runs", params(("id" = String, Path, description = "Run id")), responses((status = 201, description = "{runId, status, forkedFrom, eventsUrl, statusUrl}"), (status = 404, description = "not_found"), (status = 409, description = "conflict: the run has not ended")))]
/// `POST /v1/runs/{runId}:fork`: starts a new run of an ended run's workflow with the same inputs (from
/// the beginning: runs here have no intermediate checkpoints). Dead-lettered runs stay fork-eligible for
/// `deadLetter.retentionDays` (RFC 0053). Errors: 404 (unknown run, or a path without `:fork`), 409 (the
/// run has not ended).
pub async fn fork(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let Some(run_id) = id.strip_suffix(":fork") else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "no such endpoint; POST /v1/runs/{runId}:fork forks a run",
        ));
    };
    let run = st.engine.store.get_run(run_id).await?;
    if !run.status.is_terminal() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "only an ended run can be forked",
        ));
    }
    let new_id = tb_engine::runs::start(&st.engine, &run.workflow_id, run.inputs.clone()).await?;
    let reply = tb_api_types::RunCreated::pending(&new_id, Some(run.id));
    Ok((axum::http::StatusCode::CREATED, Json(reply)).into_response())
}

#[utoipa::path(get, path = "/v1/workflows/{id}", tag = "workflows", params(("id" = String, Path, description = "Workflow id")), responses((status = 200, description = "{workflowId, executor}"), (status = 404, description = "not_found")))]
/// `GET /v1/workflows/{workflowId}` -> `{workflowId, executor}` (`noop`, `http` or `session`; the worker URL and
/// secret are not shown). Errors: 404.
pub async fn get_workflow(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let catalog = st.engine.catalog();
    let w = catalog
        .workflow(&id)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "workflow not found"))?;
    let executor = match w.executor {
        tb_core::workflow::Executor::Noop => "noop",
        tb_core::workflow::Executor::Http { .. } => "http",
        tb_core::workflow::Executor::Session { .. } => "session",
        tb_core::workflow::Executor::Nats { .. } => "nats",
    };
    Ok(Json(json!({"workflowId": w.id, "executor": executor})))
}
