//! The flat error envelope `{error, message, details?}` with stable codes (OpenWOP core errors).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tb_core::{ErrorCode, TbError};

/// An API error: a typed [`TbError`] rendered as the flat envelope with its HTTP status.
#[derive(Debug)]
pub struct ApiError(pub TbError);

impl From<TbError> for ApiError {
    fn from(e: TbError) -> Self {
        ApiError(e)
    }
}

impl From<tb_store::StoreError> for ApiError {
    fn from(e: tb_store::StoreError) -> Self {
        ApiError(tb_engine::store_err(e))
    }
}

impl ApiError {
    /// Shorthand constructor.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError(TbError::new(code, message))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(code = self.0.code.as_str(), message = %self.0.message, "request failed");
        }
        let mut r = (
            status,
            Json(json!({"error": self.0.code.as_str(), "message": self.0.message})),
        )
            .into_response();
        // `unavailable` is always worth retrying and always says when (docs/http-api.md): 1 s unless
        // the error named a time.
        let retry_after = self
            .0
            .retry_after_s
            .or((self.0.code == tb_core::ErrorCode::Unavailable).then_some(1));
        if let Some(s) = retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// Unwraps a JSON body for every handler: an oversized body is 413 `payload_too_large`, a missing or
/// other content type 415 `unsupported_media_type`, anything else that does not parse as `shape` 400
/// `validation_error` (the body is never echoed).
pub fn json_body<T>(
    b: Result<Json<T>, axum::extract::rejection::JsonRejection>,
    shape: &str,
) -> Result<T, ApiError> {
    b.map(|Json(v)| v).map_err(|e| match e.status().as_u16() {
        413 => ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the body is over {} bytes", crate::MAX_API_BODY),
        ),
        415 => ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "send Content-Type: application/json",
        ),
        _ => ApiError::new(
            ErrorCode::ValidationError,
            format!("body must be JSON {shape}"),
        ),
    })
}

/// Unwraps a query string, mapping a malformed one to 400 `validation_error` in the envelope (without
/// echoing it).
pub fn query<T>(
    q: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    q.map(|axum::extract::Query(v)| v).map_err(|_| {
        ApiError::new(
            ErrorCode::ValidationError,
            "invalid query parameters; see docs/http-api.md for each endpoint's parameters",
        )
    })
}

/// Answer for a known path with the wrong method: 405 `method_not_allowed` in the envelope.
pub async fn method_not_allowed() -> Response {
    let body = Json(
        json!({"error": "method_not_allowed", "message": "this endpoint does not take that method"}),
    );
    (StatusCode::METHOD_NOT_ALLOWED, body).into_response()
}

/// Fallback for unknown routes: 404 `not_found` in the envelope.
pub async fn not_found() -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        "no such endpoint; see docs/http-api.md for the API",
    )
}

/// Wraps error answers produced outside our handlers (extractor rejections such as a path that is not
/// UTF-8, body-limit rejections) in the flat envelope, so every error a client sees is
/// `{error, message}` with a stable code and no echo of the request.
pub async fn envelope_errors(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (code, message) = match status.as_u16() {
        400 => ("validation_error", "the request is malformed"),
        404 => ("not_found", "not found"),
        405 => (
            "method_not_allowed",
            "this endpoint does not take that method",
        ),
        413 => ("payload_too_large", "the request body is too large"),
        415 => ("unsupported_media_type", "unsupported content type"),
        422 => ("validation_error", "the request body is not valid"),
        s if s < 500 => ("validation_error", "the request was refused"),
        _ => ("internal", "internal error"),
    };
    let mut out = (status, Json(json!({"error": code, "message": message}))).into_response();
    for h in [
        axum::http::header::RETRY_AFTER,
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::header::ALLOW,
    ] {
        if let Some(v) = resp.headers().get(&h) {
            out.headers_mut().insert(h, v.clone());
        }
    }
    out
}

#[cfg(test)]
mod retry_after_tests {
    use super::*;

    #[test]
    fn every_unavailable_answer_says_when_to_retry() {
        let r = ApiError::new(ErrorCode::Unavailable, "cannot read the key").into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");
        let named =
            ApiError(TbError::new(ErrorCode::Unavailable, "busy").retry_after(7)).into_response();
        assert_eq!(named.headers()[axum::http::header::RETRY_AFTER], "7");
        let other = ApiError::new(ErrorCode::NotFound, "no such run").into_response();
        assert!(other
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .is_none());
    }
}
