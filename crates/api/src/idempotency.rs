//! Layer-1 HTTP idempotency (OpenWOP `spec/v1/idempotency.md`, trigger-bridge notes §10) for every
//! mutating endpoint except ingest (whose dedup is the trigger dedup key): a request with
//! `Idempotency-Key` (<= 255 URL-safe characters) is claimed atomically per (principal, method + path,
//! key) in the store, so it survives restarts. The final answer (2xx and non-retryable 4xx; never
//! 400/401/403/429/5xx) is replayed for 24 h with `openwop-Idempotent-Replay: true`; the same key with a
//! different request is 409 `idempotency_key_mismatch`; a concurrent duplicate is 409
//! `idempotency_in_flight` with `details.retryAfter` (seconds) and `Retry-After`.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
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

/// The middleware.
pub async fn layer(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let mutating = matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let path = req.uri().path().to_string();
    // Ingest and capability URLs dedup by their own keys (trigger dedup key; Idempotency-Key + body
    // digest per signals-and-connectors §4.2).
    if !mutating || path.ends_with("/ingest") || path.starts_with("/v1/hooks/") {
        return next.run(req).await;
    }
    let Some(key) = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return next.run(req).await;
    };
    if !valid_key(&key) {
        return envelope(
            StatusCode::BAD_REQUEST,
            "validation_error",
            "Idempotency-Key must be 1 to 255 URL-safe characters",
            None,
        );
    }
    let principal = req
        .extensions()
        .get::<Principal>()
        .map(|p| p.0.clone())
        .unwrap_or_else(|| "anonymous".into());
    let scope = format!("{principal} {} {}", req.method(), req.uri());
    let (parts, body) = req.into_parts();
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
