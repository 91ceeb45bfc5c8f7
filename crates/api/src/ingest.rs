//! `POST /v1/trigger-subscriptions/{id}/ingest` (DESIGN §5.1; OpenWOP trigger-bridge §8).
//!
//! Answers: 202 `{"outcome":"accepted","receiptId","deliveries":[...],"runId"?}`; 202
//! `{"outcome":"unmatched","receiptId"}`; 202 `{"outcome":"dead_lettered","receiptId","deliveries"}`;
//! 200 `{"outcome":"duplicate","receiptId","runId"?}`; errors in the flat envelope (401
//! `signature_invalid`, 404 `not_found`, 409 `subscription_not_active`, 413 `payload_too_large`, 415
//! `unsupported_media_type`, 422 `unprocessable_event`, 503 `unavailable`). Only after the commit.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;
use tb_core::ErrorCode;
use tb_engine::ingest::{ingest as run_ingest, IngestAnswer};

use crate::error::ApiError;
use crate::AppState;

/// Most bytes read and discarded after a body went over its limit, so an ordinary sender still reads our
/// 413 instead of a reset connection; beyond this (or after 5 s) the connection is closed.
const DRAIN_CAP: usize = 8 * 1024 * 1024;

/// Reads the body if it is at most `limit` bytes. A single-frame body is returned without a copy. Over
/// the limit: drains up to [`DRAIN_CAP`] more and returns `Err`.
async fn read_limited(mut body: Body, limit: usize) -> Result<Bytes, ()> {
    let mut frames: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| ())?.into_data() else {
            continue;
        };
        total += data.len();
        if total > limit {
            drain(body).await;
            return Err(());
        }
        frames.push(data);
    }
    Ok(match frames.len() {
        0 => Bytes::new(),
        1 => frames.pop().expect("one frame"),
        _ => frames.concat().into(),
    })
}

/// Reads and discards up to [`DRAIN_CAP`] bytes (at most 5 s).
async fn drain(mut body: Body) {
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_CAP {
                break;
            }
        }
    })
    .await;
}

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("body exceeds this subscription's limit of {limit} bytes"),
    )
}

/// The ingest handler: reads at most the subscription's `max_body_bytes`, then runs the pipeline.
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/ingest", tag = "ingest", params(("id" = String, Path, description = "Resource id")), responses((status = 202, description = "Committed: accepted / delivered / unmatched / dead_lettered"), (status = 200, description = "Duplicate: the first receipt and run"), (status = 401, description = "signature_invalid"), (status = 404, description = "not_found"), (status = 409, description = "subscription_not_active"), (status = 413, description = "payload_too_large"), (status = 415, description = "unsupported_media_type"), (status = 422, description = "unprocessable_event")))]
pub async fn ingest(
    State(st): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Some(sub) = st.engine.catalog().subscription(&id).cloned() else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "no such trigger subscription",
        ));
    };
    let limit = sub.max_body_bytes;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let read = if declared.is_some_and(|n| n > limit) {
        drain(body).await;
        Err(())
    } else {
        read_limited(body, limit).await
    };
    let bytes = match read {
        Ok(b) => b,
        Err(()) => {
            metrics::counter!("tb_receipts_total", "connector" => sub.connector.name(), "outcome" => "too_large").increment(1);
            return Err(too_large(limit));
        }
    };
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
