//! `POST /v1/trigger-subscriptions` (OpenWOP trigger-bridge §F.2, RFC 0230): registers a `webhook`
//! subscription for a workflow and answers 201 `{subscription, binding: {ingestUrl, signingSecret,
//! secretFingerprint}}`. The `whsec_` signing secret is in this answer only; later reads show the
//! fingerprint. Errors: 400 `validation_error` (body not a registration, unsupported source, unknown
//! workflow), 501 `capability_not_provided` when the host has no secret store.

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tb_core::retry::Backoff;
use tb_core::ErrorCode;
use tb_engine::catalog::Verification;
use tb_engine::registration::{register as engine_register, RegistrationRequest};

use crate::error::ApiError;
use crate::{wire, AppState};

/// `retryPolicy` of a registration.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryBody {
    pub max_attempts: Option<u32>,
    #[schema(value_type = Option<String>)]
    pub backoff: Option<Backoff>,
}

/// `verification` of a registration.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VerificationBody {
    #[schema(value_type = Option<String>)]
    pub mode: Option<Verification>,
}

/// `TriggerSubscriptionRegistration` (closed).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistrationBody {
    pub source: String,
    pub workflow_id: String,
    pub dedup_enabled: Option<bool>,
    pub retry_policy: Option<RetryBody>,
    pub verification: Option<VerificationBody>,
    /// Host-specific hint; accepted and ignored (runs receive no payload-derived inputs from it).
    #[schema(value_type = Option<Object>)]
    pub input_mapping: Option<Value>,
}

/// The handler.
#[utoipa::path(post, path = "/v1/trigger-subscriptions", tag = "trigger-subscriptions", request_body = RegistrationBody, responses((status = 201, description = "{subscription, binding: {ingestUrl, signingSecret, secretFingerprint}}"), (status = 501, description = "capability_not_provided"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found")))]
pub async fn register(
    State(st): State<AppState>,
    principal: Option<axum::Extension<crate::auth::Principal>>,
    body: Result<Json<RegistrationBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Some(secrets) = st.secrets.as_ref() else {
        let b = json!({"error": "capability_not_provided", "message": "this host does not serve registration"});
        return Ok((StatusCode::NOT_IMPLEMENTED, Json(b)).into_response());
    };
    let b = crate::error::json_body(
        body,
        "TriggerSubscriptionRegistration: {source, workflowId, dedupEnabled?, retryPolicy?, verification?}",
    )?;
    if b.source != "webhook" {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "source must be one of triggerBridge.ingestion.externalSources: webhook",
        ));
    }
    if b.workflow_id.is_empty() {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "workflowId must not be empty",
        ));
    }
    if b.retry_policy
        .as_ref()
        .and_then(|r| r.max_attempts)
        .is_some_and(|m| !(1..=100).contains(&m))
    {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "retryPolicy.maxAttempts must be within 1..=100",
        ));
    }
    may_start_runs(
        principal,
        "registering a subscription starts runs of workflowId",
    )?;
    let req = RegistrationRequest {
        workflow_id: b.workflow_id,
        dedup_enabled: b.dedup_enabled.unwrap_or(true),
        retry: b.retry_policy.map(|r| (r.max_attempts, r.backoff)),
        verification: b.verification.and_then(|v| v.mode).unwrap_or_default(),
    };
    let done = engine_register(&st.engine, secrets, req).await?;
    let rec = st
        .engine
        .store
        .get_subscription(&done.subscription_id)
        .await?;
    let body = json!({
        "subscription": wire::subscription(&rec),
        "binding": {
            "ingestUrl": format!("/v1/trigger-subscriptions/{}/ingest", done.subscription_id),
            "signingSecret": done.signing_secret,
            "secretFingerprint": done.fingerprint,
        },
    });
    let mut resp = (StatusCode::CREATED, Json(body)).into_response();
    resp.extensions_mut()
        .insert(crate::idempotency::OneTimeSecret);
    Ok(resp)
}

/// Refuses (403 `forbidden`, saying `why` and what is missing) a key without `runs:create`: a signing
/// secret the host hands out starts runs.
fn may_start_runs(
    principal: Option<axum::Extension<crate::auth::Principal>>,
    why: &str,
) -> Result<(), ApiError> {
    let principal = principal
        .map(|p| p.0)
        .unwrap_or_else(crate::auth::Principal::anonymous);
    if principal.may("runs:create") {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("{why}: the API key also needs runs:create"),
        ))
    }
}

/// Body of `POST /v1/trigger-subscriptions/{id}/rotate-secret`: `{"overlapSeconds": N}` (optional;
/// default [`DEFAULT_OVERLAP_S`]). An empty body takes the default.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RotateBody {
    /// How long the current secret stays valid beside the new one, in seconds: 0 to 2 592 000 (30 days).
    pub overlap_seconds: Option<u64>,
}

/// The default overlap of a rotation: 24 h, in seconds.
pub const DEFAULT_OVERLAP_S: u64 = 86_400;

/// `POST /v1/trigger-subscriptions/{id}/rotate-secret` `{overlapSeconds?}` -> 200 `{subscriptionId,
/// signingSecret (shown once), secretFingerprint, previousSecretUntil (RFC 3339, or null with no
/// overlap), overlapSeconds}`: a new signing secret for a registered webhook subscription; the old one
/// is still accepted until `previousSecretUntil`, on every replica. Audited as
/// `subscription.rotate_secret` (the overlap is recorded, never a secret). The key needs
/// `webhooks:manage` and, as for registering, `runs:create`. Errors: 400 `validation_error` (bad body,
/// overlap over 30 days), 403 `forbidden` (no `runs:create`), 404 `not_found`, 409 `conflict` (a
/// subscription from the config file, a schedule, or another rotation committed first), 501
/// `capability_not_provided` (no secret store), 503 `unavailable` (no sealing key, store down).
#[utoipa::path(post, path = "/v1/trigger-subscriptions/{id}/rotate-secret", tag = "trigger-subscriptions", params(("id" = String, Path, description = "Subscription id")), request_body = RotateBody, responses((status = 200, description = "{subscriptionId, signingSecret, secretFingerprint, previousSecretUntil, overlapSeconds}"), (status = 400, description = "validation_error"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden"), (status = 404, description = "not_found"), (status = 409, description = "conflict"), (status = 501, description = "capability_not_provided")))]
pub async fn rotate(
    State(st): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    principal: Option<axum::Extension<crate::auth::Principal>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let Some(secrets) = st.secrets.as_ref() else {
        let b = json!({"error": "capability_not_provided", "message": "this host keeps no secrets of its own"});
        return Ok((StatusCode::NOT_IMPLEMENTED, Json(b)).into_response());
    };
    // The new secret signs events that start runs, as registering does.
    may_start_runs(
        principal,
        "a signing secret starts runs of the subscription's workflow",
    )?;
    let b: RotateBody = if body.iter().all(u8::is_ascii_whitespace) {
        RotateBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(
                ErrorCode::ValidationError,
                format!("body must be JSON {{\"overlapSeconds\": N}} or empty: {e}"),
            )
        })?
    };
    let overlap = b.overlap_seconds.unwrap_or(DEFAULT_OVERLAP_S);
    let done = tb_engine::registration::rotate(&st.engine, secrets, &id, overlap).await?;
    let mut resp = Json(json!({
        "subscriptionId": done.subscription_id,
        "signingSecret": done.signing_secret,
        "secretFingerprint": done.fingerprint,
        "previousSecretUntil": done.previous_secret_until.map(wire::time),
        "overlapSeconds": overlap,
    }))
    .into_response();
    resp.extensions_mut()
        .insert(crate::idempotency::OneTimeSecret);
    Ok(resp)
}
