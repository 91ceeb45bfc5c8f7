//! Layer-1 HTTP idempotency (OpenWOP `spec/v1/idempotency.md`, trigger-bridge notes §10) for every
//! guarded mutating route (public ingest and capability URLs dedup by their own keys): a request with
//! `Idempotency-Key` (1 to 255 URL-safe ASCII characters, the rule of
//! [`tb_core::idempotency::parse_key`] shared with capability URLs; anything else, or two such headers,
//! is 400 `validation_error`, never ignored) is claimed atomically per (principal, method, route
//! template + path params, key), never the query string, in the store, so it survives restarts. The
//! final answer (2xx and non-retryable 4xx; never 400/401/403/429/5xx) is replayed for 24 h with
//! `openwop-Idempotent-Replay: true`, and the answer of the request that ran carries
//! `openwop-Idempotent-Replay: false`; the same key with a different body is 409
//! `idempotency_key_mismatch`; a concurrent duplicate is 409 `idempotency_in_flight` with
//! `details.retryAfter` (seconds) and `Retry-After`.
//!
//! A request with a key runs, together with the storing of its answer, in a spawned task: a client
//! that goes away (closes the connection after its change was committed, or during a `turns:claim`
//! long-poll) cannot cancel it half-way. The retry with the same key is answered 409
//! `idempotency_in_flight` while the first one still runs, then gets the first one's answer replayed, so
//! a dropped `POST /v1/runs` never becomes a second run and a dropped claim hands its turn to the retry
//! (what must follow a commit happens where a dropped request cannot skip it).
//! Only if that task itself dies (a panic) is its claim released at once (a drop guard spawns the fenced
//! `Store::idempotency_release`, counted by `tb_idempotency_released_total`); a crashed process leaves a
//! claim to its 60 s lease, after which the retry runs the handler again.

use axum::body::Body;
use axum::extract::{RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use axum::RequestPartsExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use tb_store::{IdempotencyClaim, Store, StoredReply};

use crate::auth::Principal;
use crate::AppState;

/// Marks an answer that carries a one-time secret (a registration's or a rotation's signing secret):
/// the handler puts it in the response's extensions. Its stored reply is sealed with the host's sealing
/// key (as the secret itself is), never kept in clear; without a key it is not stored at all (a retry
/// then runs the handler again).
#[derive(Debug, Clone, Copy)]
pub struct OneTimeSecret;

/// Prefix of a stored reply body that is sealed ([`OneTimeSecret`]).
const SEALED_REPLY: &[u8] = b"tb-sealed-reply-v1:";

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

/// Releases a claim whose request task ended (a panic in the handler) before its answer was stored:
/// on drop, unless [`Release::disarm`]ed by the normal finish, a task deletes the pending claim,
/// fenced by its `lease_until` so it never deletes a claim taken over by another request.
struct Release {
    store: Option<Arc<dyn Store>>,
    scope: String,
    key: String,
    lease_until: i64,
}

impl Release {
    /// The answer was stored (or dropping the claim was): nothing left to release.
    fn disarm(mut self) {
        self.store = None;
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (scope, key, lease_until) = (
            std::mem::take(&mut self.scope),
            std::mem::take(&mut self.key),
            self.lease_until,
        );
        rt.spawn(async move {
            match store.idempotency_release(&scope, &key, lease_until).await {
                Ok(true) => {
                    metrics::counter!("tb_idempotency_released_total").increment(1);
                    tracing::warn!("a request ended before its answer was stored; its Idempotency-Key claim is released");
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "releasing the Idempotency-Key claim of an ended request failed; it lapses with its lease"
                ),
            }
        });
    }
}

/// The reply kept for a one-time-secret answer on a host without a sealing key: 409
/// `idempotency_reply_withheld`, naming the record the first request created.
fn withheld(first: &[u8]) -> StoredReply {
    let v: serde_json::Value = serde_json::from_slice(first).unwrap_or_default();
    let created = [
        "/endpointId",
        "/subscription/subscriptionId",
        "/webhookId",
        "/subscriptionId",
    ]
    .iter()
    .find_map(|p| v.pointer(p).and_then(|x| x.as_str()))
    .unwrap_or("?");
    let body = json!({
        "error": "idempotency_reply_withheld",
        "message": format!("the first request with this Idempotency-Key succeeded and created {created}; its answer held a secret shown once, which this host keeps nowhere (it has no sealing key), so it is not replayed"),
    });
    StoredReply {
        status: StatusCode::CONFLICT.as_u16(),
        content_type: Some("application/json".into()),
        body: body.to_string().into_bytes(),
    }
}

/// The host's sealing key, when it has one.
fn sealing_key(st: &AppState) -> Option<&tb_engine::sealing::SecretKey> {
    st.secrets.as_ref().and_then(|s| s.sealing_key().ok())
}

/// The associated data a sealed reply is bound to: its scope and key, so it opens only for them.
fn scope_key(scope: &str, key: &str) -> String {
    format!("idempotency {scope} {key}")
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
/// `validation_error` for an `Idempotency-Key` that is not 1 to 255 URL-safe ASCII characters, or for
/// two of them (never ignored; [`tb_core::idempotency::parse_key`]), 413 for a body over 1 MiB, 409
/// `idempotency_key_mismatch` / `idempotency_in_flight`. A claim whose request is dropped before its
/// answer is stored is released at once (see the module doc).
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
    let key = match tb_core::idempotency::parse_key(
        req.headers()
            .get_all("idempotency-key")
            .iter()
            .map(HeaderValue::as_bytes),
    ) {
        Ok(None) => return next.run(req).await,
        Ok(Some(k)) => k.to_string(),
        Err(e) => return envelope(StatusCode::BAD_REQUEST, e.code.as_str(), &e.message, None),
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
            let body = match r.body.strip_prefix(SEALED_REPLY) {
                None => r.body,
                Some(sealed) => match sealing_key(&st).map(|k| k.open(&scope_key(&scope, &key), sealed)) {
                    Some(Ok(plain)) => plain,
                    None => {
                        return envelope(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "unavailable",
                            "the first answer to this Idempotency-Key is sealed and this replica has no sealing key (set TRIGGER_BRIDGE_SECRET_KEY as on the others)",
                            None,
                        )
                    }
                    Some(Err(_)) => {
                        return envelope(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "unavailable",
                            "the first answer to this Idempotency-Key is sealed and does not open with this replica's TRIGGER_BRIDGE_SECRET_KEY (another key, or an altered record)",
                            None,
                        )
                    }
                },
            };
            let mut resp = Response::new(Body::from(body));
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
        Ok(IdempotencyClaim::New { lease_until }) => {
            let guard = Release {
                store: Some(store.clone()),
                scope: scope.clone(),
                key: key.clone(),
                lease_until,
            };
            let store = store.clone();
            let seal = sealing_key(&st).cloned();
            let task = tokio::spawn(async move {
                let resp = next
                    .run(Request::from_parts(parts, Body::from(bytes)))
                    .await;
                let (rparts, rbody) = resp.into_parts();
                let rbytes = axum::body::to_bytes(rbody, MAX_BODY)
                    .await
                    .unwrap_or_default();
                // An answer with a one-time secret is kept only sealed; without a key, a refusal naming
                // what was created is kept instead, so a retry never creates a second one.
                let content_type = rparts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                let reply = cacheable(rparts.status).then(|| {
                    match (rparts.extensions.get::<OneTimeSecret>(), &seal) {
                        (None, _) => StoredReply {
                            status: rparts.status.as_u16(),
                            content_type,
                            body: rbytes.to_vec(),
                        },
                        (Some(_), Some(k)) => {
                            let mut b = SEALED_REPLY.to_vec();
                            b.extend(k.seal(&scope_key(&scope, &key), &rbytes));
                            StoredReply {
                                status: rparts.status.as_u16(),
                                content_type,
                                body: b,
                            }
                        }
                        (Some(_), None) => withheld(&rbytes),
                    }
                });
                if let Err(e) = store
                    .idempotency_finish(&scope, &key, reply, tb_engine::clock::now_ms())
                    .await
                {
                    tracing::error!(error = %e, "storing the idempotent reply failed");
                }
                guard.disarm();
                (rparts, rbytes)
            });
            match task.await {
                Ok((rparts, rbytes)) => {
                    let mut resp = Response::from_parts(rparts, Body::from(rbytes));
                    // The first answer to a key says it is not a replay (idempotency.md, a SHOULD);
                    // the header is not part of what is stored, so a replay says `true`.
                    resp.headers_mut().insert(
                        "openwop-idempotent-replay",
                        HeaderValue::from_static("false"),
                    );
                    resp
                }
                Err(e) => envelope(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    &format!("the request failed: {e}"),
                    None,
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_withheld_reply_names_what_was_created_and_holds_no_secret() {
        let first = br#"{"endpointId":"sgep_1","token":"tok_secret","url":"/v1/hooks/tok_secret"}"#;
        let r = withheld(first);
        assert_eq!(r.status, 409);
        let text = String::from_utf8(r.body).unwrap();
        assert!(text.contains("idempotency_reply_withheld") && text.contains("created sgep_1"));
        assert!(!text.contains("tok_secret"), "{text}");
        let reg =
            br#"{"subscription":{"subscriptionId":"sub_9"},"binding":{"signingSecret":"whsec_x"}}"#;
        let text = String::from_utf8(withheld(reg).body).unwrap();
        assert!(
            text.contains("created sub_9") && !text.contains("whsec_x"),
            "{text}"
        );
    }
}
