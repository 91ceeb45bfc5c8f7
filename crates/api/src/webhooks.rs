//! `POST /v1/webhooks` and `DELETE /v1/webhooks/{webhookId}` (OpenWOP webhooks.md v1.2, durable).
//! Register body (union of the spec text and its OpenAPI): `{url, events, tenantId?, tags?, secret?,
//! signatureAlgorithms?}` -> 201 `{webhookId, secret, secretFingerprint}` (the secret is shown once).
//! Errors: 400 `validation_error` (empty `events`, an algorithm other than `v1`), 400
//! `webhook_url_rejected` (SSRF guard), 404 on delete of an unknown or foreign webhook.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tb_core::ErrorCode;

use crate::error::ApiError;
use crate::AppState;

/// Register body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebhookBody {
    pub url: String,
    pub events: Vec<String>,
    pub tenant_id: Option<String>,
    pub tags: Option<Vec<String>>,
    /// The `whsec_` key for the `standard-webhooks-1` opt-in (RFC 0201); otherwise ignored (the host
    /// generates the v1 secret).
    pub secret: Option<String>,
    pub signature_algorithms: Option<Vec<String>>,
}

/// `tenantId` of a delete.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantParam {
    pub tenant_id: Option<String>,
}

#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", request_body = WebhookBody, responses((status = 201, description = "{webhookId, secret, secretFingerprint}"), (status = 400, description = "validation_error / webhook_url_rejected")))]
/// The register handler.
pub async fn register(
    State(st): State<AppState>,
    body: Result<Json<WebhookBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Some(secrets) = st.secrets.as_ref() else {
        return Err(ApiError::new(
            ErrorCode::Unavailable,
            "this host has no secret store",
        ));
    };
    let b = crate::error::json_body(
        body,
        "{url, events, tenantId?, tags?, signatureAlgorithms?}",
    )?;
    if b.events.is_empty() || b.events.iter().any(|e| e.is_empty() || e.len() > 128) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "events must list at least one run event type",
        ));
    }
    let algs = b
        .signature_algorithms
        .clone()
        .unwrap_or_else(|| vec!["v1".into()]);
    let known = |x: &String| x == "v1" || x == "standard-webhooks-1";
    if !algs.iter().any(|x| x == "v1") || !algs.iter().all(known) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "signatureAlgorithms must contain v1, and only advertised algorithms (v1, standard-webhooks-1)",
        ));
    }
    // RFC 0201: the Standard Webhooks opt-in needs the caller's whsec_ secret.
    let standard_secret = if algs.iter().any(|x| x == "standard-webhooks-1") {
        match b.secret.clone() {
            Some(s) if s.starts_with("whsec_") => Some(s),
            _ => {
                return Err(ApiError::new(
                    ErrorCode::ValidationError,
                    "standard-webhooks-1 needs secret = whsec_<base64 of 24 to 64 bytes>",
                ))
            }
        }
    } else {
        None
    };
    let tenant = b.tenant_id.unwrap_or_else(|| "default".into());
    match tb_engine::webhooks::register(
        &st.engine,
        secrets,
        &b.url,
        b.events,
        tenant,
        st.engine
            .webhook_allow_private
            .load(std::sync::atomic::Ordering::Relaxed),
        standard_secret,
    )
    .await
    {
        Ok(c) => {
            let mut resp = (
                StatusCode::CREATED,
                Json(json!({"webhookId": c.webhook_id, "secret": c.secret, "secretFingerprint": c.fingerprint})),
            )
                .into_response();
            resp.extensions_mut()
                .insert(crate::idempotency::OneTimeSecret);
            Ok(resp)
        }
        Err(e) if e.message.starts_with("webhook_") => {
            let (code, msg) = e
                .message
                .split_once(": ")
                .unwrap_or(("webhook_url_rejected", ""));
            Ok((
                StatusCode::BAD_REQUEST,
                Json(json!({"error": code, "message": msg})),
            )
                .into_response())
        }
        Err(e) => Err(e.into()),
    }
}

#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", params(("id" = String, Path, description = "Webhook id")), responses((status = 204, description = "Deleted"), (status = 404, description = "not_found")))]
/// The delete handler.
pub async fn delete(
    State(st): State<AppState>,
    Path(id): Path<String>,
    q: Result<Query<TenantParam>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let q = crate::error::query(q)?;
    let tenant = q.tenant_id.unwrap_or_else(|| "default".into());
    tb_engine::webhooks::delete(&st.engine, &id, &tenant).await?;
    Ok(StatusCode::NO_CONTENT)
}
