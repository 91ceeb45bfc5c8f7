//! `POST /v1/trigger-subscriptions/{id}/ingest` (DESIGN §5.1; OpenWOP trigger-bridge §8).
//!
//! Answers: 202 `{"outcome":"accepted","receiptId","deliveries":[...],"runId"?}`; 202
//! `{"outcome":"unmatched","receiptId"}`; 202 `{"outcome":"dead_lettered","receiptId","deliveries"}`;
//! 200 `{"outcome":"duplicate","receiptId","runId"?}`; errors in the flat envelope (401
//! `signature_invalid`, 403 `subscription_quarantined`, 404 `not_found`, 409 `subscription_not_active`,
//! 413 `payload_too_large`, 415 `unsupported_media_type`, 408 `request_timeout`, 422
//! `unprocessable_event`, 429 `rate_limited`, 431 `headers_too_large`, 503 `unavailable`). Only after the commit.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tb_engine::ingest::{ingest as run_ingest, IngestAnswer};

use crate::error::ApiError;
use crate::AppState;

/// The ingest handler: reads at most the subscription's `max_body_bytes`, then runs the pipeline.
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/ingest", tag = "ingest", params(("id" = String, Path, description = "Resource id")), responses((status = 202, description = "Committed: accepted / delivered / unmatched / dead_lettered"), (status = 200, description = "Duplicate: the first receipt and run"), (status = 401, description = "signature_invalid"), (status = 404, description = "not_found"), (status = 403, description = "subscription_quarantined: refused before the body is read until an operator releases it"), (status = 409, description = "subscription_not_active"), (status = 413, description = "payload_too_large"), (status = 415, description = "unsupported_media_type"), (status = 408, description = "request_timeout: the body did not arrive in time"), (status = 422, description = "unprocessable_event"), (status = 429, description = "rate_limited (Retry-After): [rate_limits], the subscription's or a binding's rate_limit_per_min"), (status = 431, description = "headers_too_large"), (status = 503, description = "unavailable: too many bodies buffered (Retry-After)")))]
pub async fn ingest(
    State(st): State<AppState>,
    Path(id): Path<String>,
    gate: Option<axum::Extension<std::sync::Arc<crate::body::IngestGate>>>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let sub = st.engine.catalog().subscription(&id).cloned();
    // Quarantine and the global / per-source rate limits: before anything is read, also for an
    // unknown id (guessing ids is limited like any other request).
    st.engine.admit_request(
        sub.as_ref().map(|s| s.id.as_str()),
        peer.map(|p| p.0 .0.ip()),
        &headers,
    )?;
    let Some(sub) = sub else {
        st.engine.count_refusal(None, "not_found");
        return Err(st.engine.missing_subscription(&id).into());
    };
    let refused = |outcome: &'static str| {
        metrics::counter!("tb_receipts_total", "connector" => sub.connector.name(), "outcome" => outcome).increment(1);
        st.engine.count_refusal(Some(&sub.id), outcome);
    };
    if let Err(e) = crate::body::check_headers(&headers, &sub.limits) {
        refused("headers_too_large");
        return Err(e.into());
    }
    let limit = sub.max_body_bytes;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let gate = crate::body::gate_of(gate);
    let target = crate::body::Target::Subscription(sub.id.clone());
    let read = if crate::body::refuse_before_continue(&headers, declared, limit) {
        Err(crate::body::ReadError::TooLarge)
    } else {
        // One client's share of this subscription's body slots (docs/limits.md "Per-client
        // limits"): trickled bodies from one address cannot starve other senders of this URL.
        let client = peer.map(|p| st.engine.client_addr(p.0 .0.ip(), &headers));
        crate::body::read_ingest(body, limit, declared, &gate, &target, client).await
    };
    let bytes = match read {
        Ok(b) => b,
        Err(e) => {
            refused(match e {
                crate::body::ReadError::TooLarge => "too_large",
                crate::body::ReadError::TimedOut => "body_timeout",
                crate::body::ReadError::Busy => "overloaded",
                crate::body::ReadError::Broken => "body_broken",
            });
            return Ok(e.into_response(limit));
        }
    };
    let (bytes, headers) =
        match crate::body::decode_request(bytes, headers, &sub.limits, limit, &gate) {
            Ok(decoded) => decoded,
            Err((outcome, answer)) => {
                refused(outcome);
                return Ok(*answer);
            }
        };
    // The body's share of the byte budget is held until the last clone of `bytes` is gone (the
    // detached commit included).
    let answer = run_ingest(&st.engine, &id, &headers, bytes).await?;
    let (status, body) = match answer {
        IngestAnswer::Accepted {
            receipt_id,
            deliveries,
            run_id,
        } => {
            // OpenWOP-registered subscriptions answer with RFC 0230's word, `delivered`; configured ones
            // keep `accepted`.
            let word = if sub.registration.is_some() {
                "delivered"
            } else {
                "accepted"
            };
            let mut b = json!({"outcome": word, "receiptId": receipt_id, "deliveries": deliveries});
            if let Some(r) = run_id {
                b["runId"] = json!(r);
            }
            (StatusCode::ACCEPTED, b)
        }
        IngestAnswer::Unmatched { receipt_id } => (
            StatusCode::ACCEPTED,
            json!({"outcome": "unmatched", "receiptId": receipt_id}),
        ),
        IngestAnswer::DeadLettered {
            receipt_id,
            deliveries,
        } => (
            StatusCode::ACCEPTED,
            json!({"outcome": "dead_lettered", "receiptId": receipt_id, "deliveries": deliveries}),
        ),
        IngestAnswer::Duplicate { receipt_id, run_id } => {
            let mut b = json!({"outcome": "duplicate", "receiptId": receipt_id});
            if let Some(r) = run_id {
                b["runId"] = json!(r);
            }
            (StatusCode::OK, b)
        }
    };
    Ok((status, Json(body)).into_response())
}
