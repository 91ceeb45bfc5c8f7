//! Layer-1 HTTP idempotency (OpenWOP `spec/v1/idempotency.md`, trigger-bridge notes §10) for every
//! guarded mutating route (public ingest and capability URLs dedup by their own keys): a request with
//! `Idempotency-Key` (1 to 255 URL-safe ASCII characters; anything else is 400, never ignored) is
//! claimed atomically per (principal, method, route template + path params, key), never the query
//! string, in the store, so it survives restarts. The final answer (2xx and non-retryable 4xx; never
//! 400/401/403/429/5xx) is replayed for 24 h with `openwop-Idempotent-Replay: true`; the same key with a
//! different body is 409 `idempotency_key_mismatch`; a concurrent duplicate is 409
//! `idempotency_in_flight` with `details.retryAfter` (seconds) and `Retry-After`.

use axum::body::Body;
use axum::extract::{RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use axum::RequestPartsExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use tb_store::{IdempotencyClaim, StoredReply};

use crate::auth::Principal;
use crate::AppState;

/// Largest request or response body held for idempotency, in bytes.
const MAX_BODY: usize = 1 << 20;
/// Lease of an in-flight claim, in ms; a crashed holder's claim is taken over after it.
const LEASE_MS: u64 = 60_000;

fn envelope(status: StatusCode, code: &str, message: &str, retry_s: Option<u64>) -> Response {
    let mut body = json!({"error": code, "message": message});
    if let Some(s) = retry_s {
        body["details"] = json!({"retryAfter": s});
    }
    let mut r = (status, Json(body)).into_response();
    if let Some(s) = retry_s {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 255
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~:".contains(&b))
}

/// Whether a final answer is stored for replay.
fn cacheable(s: StatusCode) -> bool {
    s.is_success() || (s.is_client_error() && ![400, 401, 403, 429].contains(&s.as_u16()))
}

/// The idempotency scope of a request: `<principal> <METHOD> <route template> <params as JSON>`, the
/// params percent-decoded and JSON-encoded so no value can imitate another. The query string is not
/// part of it, so `?a=1` cannot turn one key into two operations.
pub fn scope(principal: &str, method: &Method, template: &str, params: &[(&str, &str)]) -> String {
    let params = serde_json::to_string(params).expect("strings encode");
    format!("{principal} {method} {template} {params}")
}

/// The per-route middleware of a guarded mutating route (added by [`crate::routes::Routes::scoped`]
/// with that route's path `template`, after the auth layer so the [`Principal`] is known). Errors: 400
/// `validation_error` for an `Idempotency-Key` that is not 1 to 255 URL-safe ASCII characters (never
/// ignored), 413 for a body over 1 MiB, 409 `idempotency_key_mismatch` / `idempotency_in_flight`.
pub async fn layer(
    State((st, template)): State<(AppState, &'static str)>,
    req: Request,
    next: Next,
) -> Response {
    let mutating = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    if !mutating {
        return next.run(req).await;
    }
    let Some(raw) = req.headers().get("idempotency-key") else {
        return next.run(req).await;
    };
    let key = match raw.to_str() {
        Ok(k) if valid_key(k) => k.to_string(),
        _ => return envelope(
            StatusCode::BAD_REQUEST,
            "validation_error",
            "Idempotency-Key must be 1 to 255 URL-safe ASCII characters (letters, digits, -_.~:)",
            None,
        ),
    };
    let principal = req
        .extensions()
        .get::<Principal>()
        .map(|p| p.0.clone())
        .unwrap_or_else(|| "anonymous".into());
    let (mut parts, body) = req.into_parts();
    let params = match parts.extract::<RawPathParams>().await {
        Ok(p) => p
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>(),
        Err(_) => Vec::new(),
    };
    let params: Vec<(&str, &str)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let scope = scope(&principal, &parts.method, template, &params);
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return envelope(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "request body over 1 MiB",
            None,
        );
    };
    let mut h = Sha256::new();
    h.update(scope.as_bytes());
    h.update([0]);
    h.update(&bytes);
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let now = tb_engine::clock::now_ms();
    let store = &st.engine.store;
    match store
        .idempotency_claim(&scope, &key, &digest, now, LEASE_MS)
        .await
    {
        Err(e) => crate::error::ApiError::from(e).into_response(),
        Ok(IdempotencyClaim::Mismatch) => envelope(
            StatusCode::CONFLICT,
            "idempotency_key_mismatch",
            "this Idempotency-Key was used with a different request",
            None,
        ),
        Ok(IdempotencyClaim::InFlight { retry_after_ms }) => envelope(
            StatusCode::CONFLICT,
            "idempotency_in_flight",
            "a request with this Idempotency-Key is still being processed",
            Some(retry_after_ms.div_ceil(1000).max(1)),
        ),
        Ok(IdempotencyClaim::Replay(r)) => {
            let mut resp = Response::new(Body::from(r.body));
            *resp.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::OK);
            if let Some(ct) = r.content_type.and_then(|c| HeaderValue::from_str(&c).ok()) {
                resp.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            resp.headers_mut().insert(
                "openwop-idempotent-replay",
                HeaderValue::from_static("true"),
            );
            resp
        }
        Ok(IdempotencyClaim::New) => {
            let resp = next
                .run(Request::from_parts(parts, Body::from(bytes)))
                .await;
            let (rparts, rbody) = resp.into_parts();
            let rbytes = axum::body::to_bytes(rbody, MAX_BODY)
                .await
                .unwrap_or_default();
            let reply = cacheable(rparts.status).then(|| StoredReply {
                status: rparts.status.as_u16(),
                content_type: rparts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
                body: rbytes.to_vec(),
            });
            if let Err(e) = store
                .idempotency_finish(&scope, &key, reply, tb_engine::clock::now_ms())
                .await
            {
                tracing::error!(error = %e, "storing the idempotent reply failed");
            }
            Response::from_parts(rparts, Body::from(rbytes))
        }
    }
}
