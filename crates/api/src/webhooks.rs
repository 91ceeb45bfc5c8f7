//! `POST /v1/webhooks` and `DELETE /v1/webhooks/{webhookId}?tenantId=` (OpenWOP webhooks.md v1.2,
//! durable). Register body (union of the spec text and its OpenAPI): `{url, events, tenantId, tags?,
//! secret?, signatureAlgorithms?}` -> 201 `{webhookId, secret, secretFingerprint}` (the secret is shown
//! once). `tenantId` (the OpenWOP workspace) is required on both, and the caller must be a member of
//! it (webhooks.md: "The caller MUST be a member of the tenant the subscription will live under";
//! [`crate::auth::is_member`], `[[api_keys]] tenants`). Errors: 400 `validation_error` (no or a
//! malformed `tenantId`, empty `events`, an algorithm other than `v1`), 400 `webhook_url_rejected`
//! (SSRF guard), 403 `forbidden` (the caller is not a member of `tenantId`), 404 `not_found` on delete
//! of a webhook that tenant does not have (unknown, deleted, or another tenant's).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tb_core::ErrorCode;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::AppState;

/// Longest `tenantId`, in characters.
pub const MAX_TENANT_ID: usize = 128;

/// The tenant a webhook request names, checked: present, 1 to [`MAX_TENANT_ID`] visible ASCII
/// characters, and `p` a member of it. Errors: 400 `validation_error` (absent or malformed), 403
/// `forbidden` (not a member; nothing about the tenant's webhooks is told).
fn member_tenant(st: &AppState, p: &Principal, tenant: Option<String>) -> Result<String, ApiError> {
    let Some(t) = tenant else {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "tenantId is required: the tenant (workspace) the webhook lives under",
        ));
    };
    if t.is_empty() || t.len() > MAX_TENANT_ID || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            format!("tenantId must be 1 to {MAX_TENANT_ID} visible ASCII characters"),
        ));
    }
    if !crate::auth::is_member(&st.keys, p, &t) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("this API key is not a member of tenant {t:?} (its [[api_keys]] tenants)"),
        ));
    }
    Ok(t)
}

/// Register body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WebhookBody {
    pub url: String,
    pub events: Vec<String>,
    /// Required (400 without); the caller must be a member of it (403 otherwise).
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

#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", request_body = WebhookBody, responses((status = 201, description = "{webhookId, secret, secretFingerprint}"), (status = 400, description = "validation_error / webhook_url_rejected"), (status = 403, description = "forbidden: not a member of tenantId")))]
/// The register handler.
pub async fn register(
    State(st): State<AppState>,
    p: Option<axum::Extension<Principal>>,
    body: Result<Json<WebhookBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let Some(secrets) = st.secrets.as_ref() else {
        return Err(ApiError::new(
            ErrorCode::Unavailable,
            "this host has no secret store",
        ));
    };
    let b = crate::error::json_body(body, "{url, events, tenantId, tags?, signatureAlgorithms?}")?;
    let p = p
        .map(|axum::Extension(p)| p)
        .unwrap_or_else(Principal::anonymous);
    let tenant = member_tenant(&st, &p, b.tenant_id.clone())?;
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

#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", params(("id" = String, Path, description = "Webhook id"), ("tenantId" = String, Query, description = "The tenant the webhook lives under (required)")), responses((status = 204, description = "Deleted"), (status = 400, description = "validation_error: no tenantId"), (status = 403, description = "forbidden: not a member of tenantId"), (status = 404, description = "not_found")))]
/// The delete handler.
pub async fn delete(
    State(st): State<AppState>,
    p: Option<axum::Extension<Principal>>,
    Path(id): Path<String>,
    q: Result<Query<TenantParam>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let q = crate::error::query(q)?;
    let p = p
        .map(|axum::Extension(p)| p)
        .unwrap_or_else(Principal::anonymous);
    let tenant = member_tenant(&st, &p, q.tenant_id)?;
    tb_engine::webhooks::delete(&st.engine, &id, &tenant).await?;
    Ok(StatusCode::NO_CONTENT)
}
