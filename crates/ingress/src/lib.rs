//! Connectors (DESIGN §3 ingress, §6): pure functions over (headers, exact raw body bytes, connector
//! config, secret, clock) that authenticate a request and build its [`NormalizedEvent`].
//!
//! Order is fixed: content checks, then the signature over the RAW bytes (constant time), and only then
//! parsing of allowlisted fields. Nothing here allocates a copy of the body or rewrites it.

#![warn(missing_docs)]

pub mod azure_devops;
pub mod capability;
mod common;
pub mod github;
pub mod hmac_generic;
pub mod secret;
pub mod standard_webhooks;

use http::HeaderMap;
use tb_core::connector::ConnectorSpec;
use tb_core::limits::JsonLimits;
use tb_core::normalized::NormalizedEvent;
use tb_core::ErrorCode;

pub use secret::{parse_whsec, SecretFormatError};

/// A request that passed authentication and normalization.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The provider's event / delivery id (`X-GitHub-Delivery`, `webhook-id`, the Azure DevOps payload's
    /// `id`, ...): the dedup identity.
    pub provider_event_id: String,
    /// The allowlisted view routing may look at.
    pub event: NormalizedEvent,
}

/// Why a request was refused. Messages never contain inbound content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngressError {
    /// Missing, malformed or wrong signature or credentials (Basic auth, secret header), or a timestamp
    /// outside the tolerance (401).
    #[error("signature invalid: {0}")]
    SignatureInvalid(&'static str),
    /// The connector does not take this content type or content encoding (415).
    #[error("unsupported media type: {0}")]
    UnsupportedMediaType(&'static str),
    /// Authentic, but the body is over one of the subscription's JSON limits (413
    /// `payload_too_large`; the answer names the limit's key).
    #[error("the request is over this subscription's {} limit (docs/limits.md)", .0.key())]
    TooLarge(tb_core::limits::Exceeded),
    /// Authentic but unusable: a required header is missing or the body is not the expected shape (422
    /// when authentic; 400 before authentication).
    #[error("malformed request: {0}")]
    Malformed(&'static str),
}

impl IngressError {
    /// The stable error code the API answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            IngressError::SignatureInvalid(_) => ErrorCode::SignatureInvalid,
            IngressError::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            IngressError::Malformed(_) => ErrorCode::UnprocessableEvent,
            IngressError::TooLarge(_) => ErrorCode::PayloadTooLarge,
        }
    }
}

/// Verifies and normalizes one request.
///
/// * `secret`: the resolved key bytes: for `standard-webhooks` the base64-decoded key (see
///   [`parse_whsec`]); for `github` and `hmac` the secret's UTF-8 bytes; for `azure-devops` the secret's
///   UTF-8 bytes, used as the Basic-auth password and/or the secret header's value.
/// * `now_unix_s`: the verifier's clock in Unix seconds (injected so tests pin it).
/// * `limits`: the subscription's JSON limits, checked after the signature and before the body is
///   parsed (github, azure-devops, standard-webhooks; the hmac connector never parses the body).
///
/// Errors: [`IngressError`]; see each connector module for its rules.
pub fn verify(
    spec: &ConnectorSpec,
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now_unix_s: i64,
    limits: &JsonLimits,
) -> Result<Verified, IngressError> {
    match spec {
        ConnectorSpec::Github => github::verify(secret, headers, body, limits),
        ConnectorSpec::StandardWebhooks { tolerance_s } => {
            standard_webhooks::verify(secret, *tolerance_s, headers, body, now_unix_s, limits)
        }
        ConnectorSpec::Hmac { .. } => hmac_generic::verify(spec, secret, headers, body, now_unix_s),
        ConnectorSpec::AzureDevops {
            basic_username,
            header_name,
        } => azure_devops::verify(
            basic_username.as_deref(),
            header_name.as_deref(),
            secret,
            headers,
            body,
            limits,
        ),
        // The webhook front end answers 404 for a schedule before it reads a body; this is the
        // backstop: a schedule takes no requests.
        ConnectorSpec::Schedule(_) | ConnectorSpec::Nats(_) => Err(IngressError::SignatureInvalid(
            "a schedule or queue subscription takes no requests",
        )),
    }
}

/// The normalized field names a connector may fill; bindings may filter on and map inputs from these only
/// (plus `event` and `action`). Used by `check-config`.
pub fn normalized_fields(spec: &ConnectorSpec) -> &'static [&'static str] {
    match spec {
        ConnectorSpec::Github => github::FIELDS,
        ConnectorSpec::StandardWebhooks { .. } => standard_webhooks::FIELDS,
        ConnectorSpec::Hmac { .. } => hmac_generic::FIELDS,
        ConnectorSpec::AzureDevops { .. } => azure_devops::FIELDS,
        ConnectorSpec::Schedule(_) => tb_core::schedule::FIELDS,
        ConnectorSpec::Nats(_) => tb_core::queue::FIELDS,
    }
}
