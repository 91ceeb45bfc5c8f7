//! Sessions over HTTP (signals-and-connectors §5): signals, waits, prompts (user input) and
//! turns on a run, plus capability endpoints (§4). Bodies are closed JSON objects; every error is the
//! flat envelope.
//!
//! | route | answer |
//! |---|---|
//! | `POST /v1/runs/{id}/signals` `{name, data?, signalId?, wake?}` | 202 `{signalId, name, raisedAt, status: queued, consumedBy?, dropped?}`; 200 `status: duplicate` |
//! | `GET /v1/runs/{id}/signals?limit=&before=` | `{runId, signals: [{seq, state, signal, consumedBy?}] newest first, buffered, nextCursor?}` |
//! | `GET /v1/runs/{id}/signal-payloads/{ref}` | the large payload's JSON bytes |
//! | `POST /v1/runs/{id}/waits` `{kind, names, timeoutMs?, userInput?, reason}` | 201 armed wait; 200 when it resolved at once |
//! | `GET /v1/runs/{id}/waits` | `{waits}` |
//! | `GET /v1/runs/{id}/waits/{waitId}?timeout=S` | the wait; long-polls up to S (<= 60) seconds while armed |
//! | `POST /v1/runs/{id}/waits/{waitId}` `{action: "cancel"}` | the cancelled wait |
//! | `POST /v1/runs/{id}/prompts` `{text}` | 201 the queued prompt turn (user input) |
//! | `POST /v1/runs/{id}/turns:claim?leaseMs=&timeout=` | 200 the claimed turn; 204 none in time |
//! | `POST /v1/runs/{id}/turns/{turnId}/ack` | the acknowledged turn |
//! | `GET /v1/runs/{id}/turns` | `{turns}` |
//! | `POST /v1/capabilities` | 201 `{endpointId, url, token, expiresAt, hmacSecret?}` (shown once) |
//! | `GET /v1/capabilities`, `POST /v1/capabilities/{id}/revoke` | records, never tokens |
//! | `POST /v1/hooks/{token}` (public) | 202 `{accepted: true, receiptId}`; 200 duplicate; 404 alike for every bad token |

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::wait::{WaitKind, WaitSpec, WaitState};
use tb_core::ErrorCode;
use tb_engine::capability::{self, MintRequest};
use tb_engine::ingest::IngestAnswer;
use tb_engine::sessions::{self, RaiseRequest};
use tb_store::{CapabilityRecord, TurnRecord};

use tb_api_types::{
    ArmWait, Prompt, RaiseSignal, SignalEntry, SignalPage, SignalRaised, Turn, TurnList, Wait,
    WaitAction, WaitList,
};

use crate::auth::Principal;
use crate::error::{json_body, ApiError};
use crate::{wire, AppState};

fn actor(p: &Option<Extension<Principal>>) -> Option<String> {
    p.as_ref().map(|Extension(p)| p.0.clone())
}

/// Raises a signal on a run. Errors: 400, 404, 409 `target_terminal`, 429 `signal_buffer_full`.
#[utoipa::path(post, path = "/v1/runs/{id}/signals", tag = "signals", request_body = RaiseSignal, params(("id" = String, Path, description = "Run id")), responses((status = 202, description = "{signalId, name, raisedAt, status: queued, consumedBy?, dropped?}"), (status = 200, description = "status: duplicate (the signalId was seen before)"), (status = 400, description = "validation_error"), (status = 404, description = "not_found"), (status = 409, description = "target_terminal"), (status = 429, description = "signal_buffer_full")))]
pub async fn raise(
    State(st): State<AppState>,
    Path(id): Path<String>,
    who: Option<Extension<Principal>>,
    b: Result<Json<RaiseSignal>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(b, "{name, data?, signalId?, wake?}")?;
    let out = sessions::raise(
        &st.engine,
        &id,
        RaiseRequest {
            name: b.name,
            data: b.data,
            signal_id: b.signal_id,
            wake: b.wake,
        },
        actor(&who),
    )
    .await?;
    let field = |k: &str| out.signal[k].as_str().unwrap_or_default().to_string();
    let reply = SignalRaised {
        signal_id: field("signalId"),
        name: field("name"),
        raised_at: field("raisedAt"),
        status: out.status.to_string(),
        consumed_by: out.consumed_by.clone(),
        dropped: out.dropped.clone(),
    };
    let status = if out.status == "duplicate" {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(reply)).into_response())
}

/// Query of `GET /v1/runs/{id}/signals`: `limit` (1..=500, default 50; larger is clamped), `before`
/// (the `nextCursor` of the previous page: a signal's `seq`).
#[derive(Debug, Deserialize, Default)]
pub struct SignalListParams {
    pub limit: Option<u32>,
    pub before: Option<String>,
}

/// The run's mailbox for authorized inspection, one page newest first (like every list): each signal
/// with its arrival number `seq` and state (`buffered`, `consumed`, `dropped`, `expired`), `buffered`
/// (the run's buffered count, all pages) and `nextCursor` (a `seq`, for `before`) when the page is
/// full. Settled signals expire with the body retention. Errors: 400 `validation_error` (a `before`
/// that is not a positive integer), 404.
#[utoipa::path(get, path = "/v1/runs/{id}/signals", tag = "signals", params(("id" = String, Path, description = "Run id"), ("limit" = Option<u32>, Query, description = "1..=500, default 50"), ("before" = Option<String>, Query, description = "nextCursor of the previous page")), responses((status = 200, description = "{runId, signals, buffered, nextCursor?}"), (status = 400, description = "validation_error"), (status = 404, description = "not_found")))]
pub async fn list_signals(
    State(st): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<SignalListParams>, QueryRejection>,
) -> Result<Json<SignalPage>, ApiError> {
    let q = crate::error::query(q)?;
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let before = match q.before.as_deref() {
        None => None,
        Some(b) => Some(b.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
            ApiError::new(
                ErrorCode::ValidationError,
                "before must be a nextCursor value from a previous page",
            )
        })?),
    };
    let page = st.engine.store.list_signals(&id, before, limit).await?;
    let signals = page
        .signals
        .iter()
        .map(|s| {
            Ok(SignalEntry {
                seq: s.seq,
                state: s.state.clone(),
                signal: serde_json::from_value(s.signal.clone()).map_err(stored_shape)?,
                consumed_by: s.consumed_by.clone(),
                settled_at: s.settled_at.map(wire::time),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let full = page.signals.len() as u32 >= limit;
    let next_cursor = page
        .signals
        .last()
        .filter(|_| full)
        .map(|l| l.seq.to_string());
    Ok(Json(SignalPage {
        run_id: id,
        signals,
        buffered: page.buffered,
        next_cursor,
    }))
}

/// A stored session record that does not read as its wire shape: a 500, never a partial answer.
fn stored_shape(e: serde_json::Error) -> ApiError {
    ApiError::new(
        ErrorCode::Internal,
        format!("a stored session record does not match its wire shape: {e}"),
    )
}

/// A wait's wire shape: the store's view (the one the wait turns carry too), read as [`Wait`].
fn wait(w: &tb_store::WaitRecord) -> Result<Wait, ApiError> {
    serde_json::from_value(tb_store::sql::wait_view(w)).map_err(stored_shape)
}

/// The bytes behind a signal's `payloadRef` (authorized readers only; never inlined in history).
#[utoipa::path(get, path = "/v1/runs/{id}/signal-payloads/{ref}", tag = "signals", params(("id" = String, Path, description = "Run id"), ("ref" = String, Path, description = "payloadRef")), responses((status = 200, description = "application/json payload"), (status = 404, description = "not_found")))]
pub async fn signal_payload(
    State(st): State<AppState>,
    Path((id, r)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let b = st.engine.store.signal_payload(&id, &r).await?;
    Ok(([(http::header::CONTENT_TYPE, "application/json")], b).into_response())
}

/// Arms a wait. A buffered match (oldest first), queued user input or a past deadline resolves it at
/// once: 200 with the resolved wait; otherwise 201 armed, and the run reads `waiting-external`.
#[utoipa::path(post, path = "/v1/runs/{id}/waits", tag = "waits", request_body = ArmWait, params(("id" = String, Path, description = "Run id")), responses((status = 201, description = "the armed wait"), (status = 200, description = "the wait, resolved at once"), (status = 400, description = "validation_error"), (status = 404, description = "not_found"), (status = 409, description = "target_terminal")))]
pub async fn create_wait(
    State(st): State<AppState>,
    Path(id): Path<String>,
    b: Result<Json<ArmWait>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(b, "{kind, names, timeoutMs?, userInput?, reason}")?;
    let kind = match b.kind.as_str() {
        "signal" => WaitKind::Signal,
        "any" => WaitKind::Any,
        _ => {
            return Err(ApiError::new(
                ErrorCode::ValidationError,
                "kind must be \"signal\" or \"any\"",
            ))
        }
    };
    let spec = WaitSpec {
        kind,
        names: b.names,
        timeout_ms: b.timeout_ms,
        user_input: b.user_input.unwrap_or(kind == WaitKind::Any),
        reason: b.reason,
    };
    let w = sessions::create_wait(&st.engine, &id, spec).await?;
    let status = if w.state == WaitState::Armed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(wait(&w)?)).into_response())
}

/// Every wait of a run, oldest first.
#[utoipa::path(get, path = "/v1/runs/{id}/waits", tag = "waits", params(("id" = String, Path, description = "Run id")), responses((status = 200, description = "{waits}"), (status = 404, description = "not_found")))]
pub async fn list_waits(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WaitList>, ApiError> {
    let ws = st.engine.store.list_waits(&id).await?;
    let waits = ws.iter().map(wait).collect::<Result<_, _>>()?;
    Ok(Json(WaitList { run_id: id, waits }))
}

/// Query of the long-polls: wait up to `timeout` seconds (default 0 for a wait read, 30 for a claim;
/// at most 60); `leaseMs` of a claim (default 60 000, 1 000 ..= 3 600 000).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollParams {
    pub timeout: Option<u64>,
    pub lease_ms: Option<u64>,
}

/// One wait; with `?timeout=S` it answers as soon as the wait leaves `armed`, or after S seconds.
#[utoipa::path(get, path = "/v1/runs/{id}/waits/{waitId}", tag = "waits", params(("id" = String, Path, description = "Run id"), ("waitId" = String, Path, description = "Wait id")), responses((status = 200, description = "{waitId, state: armed|resolved|cancelled, reason, deadline?, winner?, losers}"), (status = 404, description = "not_found")))]
pub async fn get_wait(
    State(st): State<AppState>,
    Path((id, wait_id)): Path<(String, String)>,
    q: Result<Query<PollParams>, QueryRejection>,
) -> Result<Json<Wait>, ApiError> {
    let q = crate::error::query(q)?;
    let t = Duration::from_secs(q.timeout.unwrap_or(0).min(60));
    let w = sessions::poll_wait(&st.engine, &id, &wait_id, t).await?;
    Ok(Json(wait(&w)?))
}

/// `{action: "cancel"}` cancels an armed wait. Errors: 400, 404, 409 `conflict` when not armed.
#[utoipa::path(post, path = "/v1/runs/{id}/waits/{waitId}", tag = "waits", request_body = WaitAction, params(("id" = String, Path, description = "Run id"), ("waitId" = String, Path, description = "Wait id")), responses((status = 200, description = "the cancelled wait"), (status = 400, description = "validation_error"), (status = 404, description = "not_found"), (status = 409, description = "conflict")))]
pub async fn wait_action(
    State(st): State<AppState>,
    Path((id, wait_id)): Path<(String, String)>,
    b: Result<Json<WaitAction>, JsonRejection>,
) -> Result<Json<Wait>, ApiError> {
    let b = json_body(b, "{action: \"cancel\"}")?;
    if b.action != "cancel" {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "action must be \"cancel\"",
        ));
    }
    let w = sessions::cancel_wait(&st.engine, &id, &wait_id).await?;
    Ok(Json(wait(&w)?))
}

/// Queues user input. It interrupts an armed signal wait for one turn (the wait re-arms with its
/// remaining deadline when that turn is acknowledged) or wins an `any` wait that races user input.
#[utoipa::path(post, path = "/v1/runs/{id}/prompts", tag = "turns", request_body = Prompt, params(("id" = String, Path, description = "Run id")), responses((status = 201, description = "the queued prompt turn"), (status = 400, description = "validation_error"), (status = 404, description = "not_found"), (status = 409, description = "target_terminal")))]
pub async fn prompt(
    State(st): State<AppState>,
    Path(id): Path<String>,
    who: Option<Extension<Principal>>,
    b: Result<Json<Prompt>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(b, "{text}")?;
    let t = sessions::prompt(&st.engine, &id, b.text, actor(&who)).await?;
    Ok((StatusCode::CREATED, Json(turn(&t))).into_response())
}

fn turn(t: &TurnRecord) -> Turn {
    Turn {
        turn_id: t.id.clone(),
        run_id: t.run_id.clone(),
        seq: t.seq,
        kind: t.kind.as_str().to_string(),
        state: t.state.as_str().to_string(),
        claims: t.claims,
        content: t.content.clone(),
        created_at: wire::time(t.created_at),
        lease_until: t.lease_until.map(wire::time),
        acked_at: t.acked_at.map(wire::time),
    }
}

/// Claims the run's next turn (one at a time, in order), long-polling up to `timeout` s. An
/// unacknowledged turn comes back after `leaseMs`. 204 when nothing arrived in time.
#[utoipa::path(post, path = "/v1/runs/{id}/turns:claim", tag = "turns", params(("id" = String, Path, description = "Run id")), responses((status = 200, description = "the claimed turn"), (status = 204, description = "no turn in time"), (status = 404, description = "not_found"), (status = 409, description = "target_terminal")))]
pub async fn claim(
    State(st): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<PollParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = crate::error::query(q)?;
    let lease = q.lease_ms.unwrap_or(60_000);
    if !(1_000..=3_600_000).contains(&lease) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "leaseMs must be between 1000 and 3600000",
        ));
    }
    let timeout = Duration::from_secs(q.timeout.unwrap_or(30).min(60));
    match sessions::claim(&st.engine, &id, Duration::from_millis(lease), timeout).await? {
        Some(t) => Ok(Json(turn(&t)).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// Query of an ack: `claim`, the turn's `claims` count as returned by the claim.
#[derive(Debug, Deserialize)]
pub struct AckParams {
    pub claim: u32,
}

/// Acknowledges a claimed turn (`?claim=<claims>` from the claim). Errors: 400 without `claim`; 404;
/// 409 `conflict` when it is not claimed or was claimed again after this driver's lease lapsed; 409
/// `target_terminal` once the run ended.
#[utoipa::path(post, path = "/v1/runs/{id}/turns/{turnId}/ack", tag = "turns", params(("id" = String, Path, description = "Run id"), ("turnId" = String, Path, description = "Turn id"), ("claim" = u32, Query, description = "The turn's claims count from the claim")), responses((status = 200, description = "the acknowledged turn"), (status = 400, description = "validation_error"), (status = 404, description = "not_found"), (status = 409, description = "conflict or target_terminal")))]
pub async fn ack(
    State(st): State<AppState>,
    Path((id, t)): Path<(String, String)>,
    q: Result<Query<AckParams>, QueryRejection>,
) -> Result<Json<Turn>, ApiError> {
    let q = q.map(|Query(q)| q).map_err(|_| {
        ApiError::new(
            ErrorCode::ValidationError,
            "claim is required and is a whole number: ?claim=<the turn's claims count from the claim>",
        )
    })?;
    Ok(Json(turn(
        &sessions::ack(&st.engine, &id, &t, q.claim).await?,
    )))
}

/// Every turn of a run in order.
#[utoipa::path(get, path = "/v1/runs/{id}/turns", tag = "turns", params(("id" = String, Path, description = "Run id")), responses((status = 200, description = "{turns}"), (status = 404, description = "not_found")))]
pub async fn list_turns(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TurnList>, ApiError> {
    let ts = st.engine.store.list_turns(&id).await?;
    let turns = ts.iter().map(turn).collect();
    Ok(Json(TurnList { run_id: id, turns }))
}

/// Body of `POST /v1/capabilities`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MintBody {
    pub run_id: String,
    /// Signal name raised on every request.
    pub signal: String,
    pub label: Option<String>,
    /// Lifetime in seconds (default 30 days, at most 90).
    pub expires_in_s: Option<u64>,
    /// 1 ..= 1 000 000 (default 1 000).
    pub max_uses: Option<u64>,
    #[serde(default)]
    pub wake: bool,
    /// Require `X-Signature-256: sha256=<hex>` with a generated key (shown once).
    #[serde(default)]
    pub hmac: bool,
}

fn capability(c: &CapabilityRecord) -> Value {
    json!({
        "endpointId": c.id,
        "runId": c.run_id,
        "signal": c.signal,
        "label": c.label,
        "wake": c.wake,
        "hmac": c.hmac,
        "createdBy": c.created_by,
        "createdAt": wire::time(c.created_at),
        "expiresAt": wire::time(c.expires_at),
        "maxUses": c.max_uses,
        "useCount": c.use_count,
        "revokedAt": c.revoked_at.map(wire::time),
    })
}

/// Mints a capability URL for one signal on one run. The token (and HMAC key) is in this answer only.
#[utoipa::path(post, path = "/v1/capabilities", tag = "capabilities", request_body = MintBody, responses((status = 201, description = "{endpointId, url, token, expiresAt, hmacSecret?, ...}"), (status = 400, description = "validation_error"), (status = 404, description = "not_found"), (status = 409, description = "target_terminal")))]
pub async fn mint(
    State(st): State<AppState>,
    who: Option<Extension<Principal>>,
    b: Result<Json<MintBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let b = json_body(
        b,
        "{runId, signal, label?, expiresInS?, maxUses?, wake?, hmac?}",
    )?;
    let m = capability::mint(
        &st.engine,
        st.secrets.as_ref(),
        MintRequest {
            run_id: b.run_id,
            signal: b.signal,
            label: b.label,
            expires_in_s: b.expires_in_s,
            max_uses: b.max_uses,
            wake: b.wake,
            hmac: b.hmac,
        },
        actor(&who),
    )
    .await?;
    let mut v = capability(&m.record);
    v["url"] = json!(format!("/v1/hooks/{}", m.token));
    v["token"] = json!(m.token);
    if let Some(s) = m.hmac_secret {
        v["hmacSecret"] = json!(s);
    }
    // The token is a bearer secret, shown once: an idempotent replay of this answer is kept sealed.
    let mut resp = (StatusCode::CREATED, Json(v)).into_response();
    resp.extensions_mut()
        .insert(crate::idempotency::OneTimeSecret);
    Ok(resp)
}

/// Every minted endpoint, newest first; tokens are never shown again.
#[utoipa::path(get, path = "/v1/capabilities", tag = "capabilities", responses((status = 200, description = "{capabilities}")))]
pub async fn list_capabilities(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let cs = st.engine.store.list_capabilities().await?;
    Ok(Json(
        json!({"capabilities": cs.iter().map(capability).collect::<Vec<_>>()}),
    ))
}

/// Revokes an endpoint; its next request gets 404. Idempotent. Errors: 404.
#[utoipa::path(post, path = "/v1/capabilities/{id}/revoke", tag = "capabilities", params(("id" = String, Path, description = "Endpoint id")), responses((status = 200, description = "the revoked endpoint"), (status = 404, description = "not_found")))]
pub async fn revoke(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(capability(
        &capability::revoke(&st.engine, &id).await?,
    )))
}

/// The public capability URL (signals-and-connectors §4.2). Never echoes the payload. The token is
/// looked up before the body is read (a bad one is 404 without holding a body slot); the body is then
/// buffered under [`crate::body::Target::Capabilities`], the share of the body slots every capability
/// URL has together.
#[utoipa::path(post, path = "/v1/hooks/{token}", tag = "ingest", params(("token" = String, Path, description = "Minted token")), responses((status = 202, description = "{accepted: true, receiptId}"), (status = 200, description = "duplicate Idempotency-Key with the same body"), (status = 400, description = "validation_error: an Idempotency-Key that is not 1 to 255 URL-safe ASCII characters, or two of them"), (status = 401, description = "signature_invalid"), (status = 404, description = "not_found (unknown, revoked, expired or used up)"), (status = 409, description = "conflict (same Idempotency-Key, other body) or target_terminal"), (status = 413, description = "payload_too_large"), (status = 415, description = "unsupported_media_type"), (status = 408, description = "request_timeout: the body did not arrive in time"), (status = 429, description = "rate_limited (Retry-After)"), (status = 503, description = "unavailable: the capability URLs' share of the body slots, or the byte budget, is full (Retry-After: 1)")))]
pub async fn hook(
    State(st): State<AppState>,
    token: Result<Path<String>, axum::extract::rejection::PathRejection>,
    gate: Option<axum::Extension<std::sync::Arc<crate::body::IngestGate>>>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    // The global and per-source rate limits before anything else, so guessing tokens is limited too.
    st.engine
        .admit_request(None, peer.map(|p| p.0 .0.ip()), &headers)?;
    // A token that is not even a valid path segment is as unknown as any other (the same 404).
    let Ok(Path(token)) = token else {
        return Err(ApiError::new(ErrorCode::NotFound, "no such endpoint"));
    };
    // The token first: a made-up one costs a hash and an indexed read, never a body slot.
    // Then the body, buffered under the capability pool's share of the edge's body
    // slots and the byte budget, like trigger ingest.
    let endpoint = capability::find(&st.engine, &token).await?;
    crate::body::check_headers(&headers, &tb_core::limits::Limits::default())?;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let gate = crate::body::gate_of(gate);
    let target = crate::body::Target::Capabilities;
    // At most the capability limit (32 KiB), so a 413 names the limit that applies and a live token
    // never makes us buffer more than that.
    let limit = capability::MAX_BODY_BYTES;
    let read = if crate::body::refuse_before_continue(&headers, declared, limit) {
        Err(crate::body::ReadError::TooLarge)
    } else {
        // One client's share of the capability pool (docs/limits.md "Per-client limits").
        let client = peer.map(|p| st.engine.client_addr(p.0 .0.ip(), &headers));
        crate::body::read_ingest(body, limit, declared, &gate, &target, client).await
    };
    let bytes = match read {
        Ok(b) => b,
        Err(e) => return Ok(e.into_response(limit)),
    };
    let answer =
        capability::ingest(&st.engine, st.secrets.as_ref(), &endpoint, &headers, bytes).await?;
    Ok(match answer {
        IngestAnswer::Duplicate { receipt_id, .. } => (
            StatusCode::OK,
            Json(json!({"accepted": true, "duplicate": true, "receiptId": receipt_id})),
        )
            .into_response(),
        IngestAnswer::Accepted { receipt_id, .. }
        | IngestAnswer::Unmatched { receipt_id }
        | IngestAnswer::DeadLettered { receipt_id, .. } => (
            StatusCode::ACCEPTED,
            Json(json!({"accepted": true, "receiptId": receipt_id})),
        )
            .into_response(),
    })
}
