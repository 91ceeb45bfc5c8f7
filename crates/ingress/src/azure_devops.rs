//! Azure DevOps service hooks connector (`ConnectorSpec::AzureDevops`; signals-and-connectors §2).
//!
//! Azure DevOps signs nothing: authenticity rests on Basic auth and/or a secret custom header over TLS
//! (§2.2). Order: content type / encoding (415), then authentication with constant-time comparisons
//! (401), and only then parsing of the body (422), then normalization of the allowlisted scalar fields in
//! [`FIELDS`].
//!
//! Decisions:
//! * The delivery identity is the payload's top-level `id` (the event GUID, §2.3); Azure DevOps sends no
//!   delivery header.
//! * `event` is the payload's `eventType` verbatim (e.g. `git.pullrequest.created`) and `action` is always
//!   `None`, so bindings match on the full event type. The lifecycle action of the reference mapping
//!   (§0.4: `created` / `updated` / `merge_attempted`) is the field `pull_request.action`.
//! * A body that authenticates but is not valid UTF-8 JSON, or is not a JSON object, is
//!   [`IngressError::Malformed`] (422): deterministic, and never retried by the sender as transient.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use http::HeaderMap;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tb_core::limits::JsonLimits;
use tb_core::normalized::NormalizedEvent;

use crate::common::{
    bounded_id, header, parse_json, require_identity_encoding, require_json_content_type, Header,
};
use crate::{IngressError, Verified};

/// Header carrying `Basic base64(username ":" password)` (RFC 7617).
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// `eventType` of a pull-request comment: the PR sits under `resource.pullRequest` (§2.3).
pub const PR_COMMENT_EVENT: &str = "ms.vss-code.git-pullrequest-comment-event";

/// Longest string value copied into a normalized field, in characters. Longer strings (and strings with
/// control characters) are **skipped**, never truncated: a truncated value could spuriously satisfy an
/// equality filter.
pub const MAX_FIELD_STRING_CHARS: usize = 256;

/// Longest accepted `eventType`, in bytes.
const MAX_EVENT_LEN: usize = 128;

/// Longest `Authorization` value examined, in bytes; longer ones are refused unread.
const MAX_AUTHORIZATION_LEN: usize = 4096;

/// The normalized fields this connector may fill: dotted paths into the payload, copied only when present
/// and scalar (string of at most [`MAX_FIELD_STRING_CHARS`] characters without control characters,
/// number, or boolean), plus the derived `pull_request.action`.
///
/// For `ms.vss-code.git-pullrequest-comment-event`, whose pull request is under `resource.pullRequest`,
/// the `resource.*` pull-request fields (`resource.pullRequestId`, `resource.repository.*`,
/// `resource.status`, `resource.mergeStatus`, `resource.sourceRefName`, `resource.targetRefName`,
/// `resource.isDraft`) are taken from `resource.pullRequest.*` when absent at `resource.*`, so one
/// coalesce key (repository id + pull request id) works for PR events and their comments.
///
/// Free text (comment content, titles, descriptions, messages) and URLs are deliberately absent
/// (signals-and-connectors §0.3, §0.4).
pub const FIELDS: &[&str] = &[
    "publisherId",
    "resource.repository.id",
    "resource.repository.name",
    "resource.repository.project.id",
    "resource.repository.project.name",
    "resource.pullRequestId",
    "resource.status",
    "resource.mergeStatus",
    "resource.sourceRefName",
    "resource.targetRefName",
    "resource.isDraft",
    "resource.id",
    "resource.result",
    "resource.definition.id",
    "resource.definition.name",
    "resource.buildNumber",
    "resource.comment.id",
    "resourceContainers.project.id",
    PULL_REQUEST_ACTION,
];

/// Derived field: the §0.4 lifecycle action of `git.pullrequest.created|updated|merged`.
pub const PULL_REQUEST_ACTION: &str = "pull_request.action";

/// `resource.*` fields that fall back to `resource.pullRequest.*` (the comment event's layout).
const PR_FALLBACK: &[&str] = &[
    "resource.pullRequestId",
    "resource.repository.id",
    "resource.repository.name",
    "resource.repository.project.id",
    "resource.repository.project.name",
    "resource.status",
    "resource.mergeStatus",
    "resource.sourceRefName",
    "resource.targetRefName",
    "resource.isDraft",
];

/// The lifecycle action of a pull-request event type (signals-and-connectors §0.4 reference mapping):
/// `git.pullrequest.created` -> `created`, `.updated` -> `updated`, `.merged` -> `merge_attempted`
/// (a merge commit was created or attempted; not PR completion, §2.3). `None` for other event types.
pub fn pull_request_action(event_type: &str) -> Option<&'static str> {
    match event_type {
        "git.pullrequest.created" => Some("created"),
        "git.pullrequest.updated" => Some("updated"),
        "git.pullrequest.merged" => Some("merge_attempted"),
        _ => None,
    }
}

/// Checks a connector configuration: at least one of `basic_username` / `header_name`; a username that
/// is non-empty, at most 256 bytes and has no `:` or control characters (RFC 7617); a header name that
/// is a valid HTTP header name and, when Basic auth is also configured, not `Authorization`. The error
/// says what to fix. Used by config validation; [`verify`] refuses a configuration this rejects.
pub fn check_config(
    basic_username: Option<&str>,
    header_name: Option<&str>,
) -> Result<(), &'static str> {
    if basic_username.is_none() && header_name.is_none() {
        return Err("set basic_username (the secret is the Basic-auth password) and/or header_name (the secret is that header's value)");
    }
    if let Some(u) = basic_username {
        if u.is_empty() || u.len() > 256 || u.contains(':') || u.chars().any(char::is_control) {
            return Err(
                "basic_username must be 1 to 256 characters without ':' or control characters",
            );
        }
    }
    if let Some(h) = header_name {
        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
            return Err("header_name must be a valid HTTP header name, e.g. X-Hook-Secret");
        }
        if basic_username.is_some() && h.eq_ignore_ascii_case(AUTHORIZATION_HEADER) {
            return Err("header_name cannot be Authorization when basic_username is set (Basic auth uses it); pick another header, e.g. X-Hook-Secret");
        }
    }
    Ok(())
}

/// Constant-time equality that does not leak lengths: both sides are hashed with SHA-256 first.
fn ct_eq(given: &[u8], expected: &[u8]) -> subtle::Choice {
    Sha256::digest(given).ct_eq(&Sha256::digest(expected))
}

/// Checks `Authorization: Basic base64(user:password)` (scheme case-insensitive, standard base64 with
/// padding) against `username` / `secret`. Username and password are both compared, in constant time.
fn check_basic(username: &str, secret: &[u8], headers: &HeaderMap) -> Result<(), IngressError> {
    let value = match header(headers, AUTHORIZATION_HEADER) {
        Header::Value(v) => v.trim(),
        Header::Missing => return Err(IngressError::SignatureInvalid("missing Authorization")),
        Header::Invalid => {
            return Err(IngressError::SignatureInvalid(
                "Authorization is repeated or unreadable",
            ))
        }
    };
    if value.len() > MAX_AUTHORIZATION_LEN {
        return Err(IngressError::SignatureInvalid("Authorization is too long"));
    }
    let (scheme, credentials) = value.split_once([' ', '\t']).unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(IngressError::SignatureInvalid(
            "Authorization scheme must be Basic",
        ));
    }
    let decoded = STANDARD.decode(credentials.trim()).map_err(|_| {
        IngressError::SignatureInvalid("Authorization Basic credentials are not valid base64")
    })?;
    let colon = decoded
        .iter()
        .position(|&b| b == b':')
        .ok_or(IngressError::SignatureInvalid(
            "Authorization Basic credentials lack the user:password separator",
        ))?;
    let (user, password) = (&decoded[..colon], &decoded[colon + 1..]);
    let ok = ct_eq(user, username.as_bytes()) & ct_eq(password, secret);
    if bool::from(ok) {
        Ok(())
    } else {
        Err(IngressError::SignatureInvalid(
            "Basic credentials do not match",
        ))
    }
}

/// Checks that header `name` carries exactly `secret` (surrounding whitespace ignored), in constant time.
fn check_secret_header(name: &str, secret: &[u8], headers: &HeaderMap) -> Result<(), IngressError> {
    let value = match header(headers, name) {
        Header::Value(v) => v.trim(),
        Header::Missing => {
            return Err(IngressError::SignatureInvalid(
                "missing the configured secret header",
            ))
        }
        Header::Invalid => {
            return Err(IngressError::SignatureInvalid(
                "the configured secret header is repeated or unreadable",
            ))
        }
    };
    if bool::from(ct_eq(value.as_bytes(), secret)) {
        Ok(())
    } else {
        Err(IngressError::SignatureInvalid(
            "the configured secret header does not match",
        ))
    }
}

/// Walks a dotted path through nested objects.
fn lookup<'a>(root: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut current = root.get(parts.next()?)?;
    for part in parts {
        current = current.as_object()?.get(part)?;
    }
    Some(current)
}

/// A copy of `v` when it may enter a normalized event: numbers, booleans, and strings of at most
/// [`MAX_FIELD_STRING_CHARS`] characters without control characters. Everything else is skipped.
fn scalar(v: &Value) -> Option<Value> {
    match v {
        Value::Bool(_) | Value::Number(_) => Some(v.clone()),
        Value::String(s)
            if s.chars().count() <= MAX_FIELD_STRING_CHARS && !s.chars().any(char::is_control) =>
        {
            Some(v.clone())
        }
        _ => None,
    }
}

/// An event type: 1..=128 bytes of `[A-Za-z0-9_.-]`.
fn is_event_type(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_EVENT_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The allowlisted fields of an authenticated payload (see [`FIELDS`]).
fn normalize(payload: &Map<String, Value>, event_type: &str) -> BTreeMap<String, Value> {
    let mut fields: BTreeMap<String, Value> = FIELDS
        .iter()
        .filter(|path| **path != PULL_REQUEST_ACTION)
        .filter_map(|path| Some(((*path).to_owned(), scalar(lookup(payload, path)?)?)))
        .collect();
    for path in PR_FALLBACK {
        if fields.contains_key(*path) {
            continue;
        }
        let nested = format!(
            "resource.pullRequest.{}",
            path.strip_prefix("resource.").unwrap_or(path)
        );
        if let Some(v) = lookup(payload, &nested).and_then(scalar) {
            fields.insert((*path).to_owned(), v);
        }
    }
    if let Some(action) = pull_request_action(event_type) {
        fields.insert(PULL_REQUEST_ACTION.to_owned(), Value::String(action.into()));
    }
    fields
}

/// Verifies and normalizes one Azure DevOps service-hook request (signals-and-connectors §2).
///
/// * `basic_username`: when `Some`, `Authorization: Basic base64(username ":" secret)` is required.
/// * `header_name`: when `Some`, that header must carry exactly `secret`.
/// * `secret`: the subscription's resolved secret bytes (an empty secret refuses everything). With both
///   settings, both checks must pass (the same secret serves as password and header value).
/// * `body`: the exact raw request bytes, parsed only after authentication.
///
/// Result: `provider_event_id` = the payload's top-level `id` (trimmed, 1..=128 visible ASCII
/// characters); `event.event` = `eventType` (e.g. `git.pullrequest.created`); `event.action` = `None`;
/// `event.fields` = the [`FIELDS`] present as scalars, with `pull_request.action` set per
/// [`pull_request_action`].
///
/// Errors:
/// * [`IngressError::UnsupportedMediaType`] (415): `Content-Type` other than `application/json`
///   (parameters such as `; charset=utf-8` allowed; absent is accepted), or a `Content-Encoding` other than
///   `identity`.
/// * [`IngressError::SignatureInvalid`] (401): neither setting configured or an invalid configuration
///   (see [`check_config`]), empty secret, `Authorization` missing / repeated / not `Basic` / not base64 /
///   without `:` / not matching, the secret header missing / repeated / not matching. Messages never
///   contain request content.
/// * [`IngressError::TooLarge`] (413, after authentication): the JSON is over `limits`.
/// * [`IngressError::Malformed`] (422, after authentication): body not valid UTF-8 JSON or not an object,
///   `id` missing or not a short identifier, `eventType` missing or not a short dotted name.
pub fn verify(
    basic_username: Option<&str>,
    header_name: Option<&str>,
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    limits: &JsonLimits,
) -> Result<Verified, IngressError> {
    require_json_content_type(headers, "Azure DevOps service hooks send application/json")?;
    require_identity_encoding(headers)?;
    if check_config(basic_username, header_name).is_err() {
        return Err(IngressError::SignatureInvalid(
            "azure-devops connector is not configured with basic_username or header_name",
        ));
    }
    if secret.is_empty() {
        return Err(IngressError::SignatureInvalid("no secret configured"));
    }
    if let Some(user) = basic_username {
        check_basic(user, secret, headers)?;
    }
    if let Some(name) = header_name {
        check_secret_header(name, secret, headers)?;
    }

    let payload = match parse_json::<Value>(body, limits, "body is not valid JSON")? {
        Value::Object(map) => map,
        _ => return Err(IngressError::Malformed("payload is not a JSON object")),
    };
    let provider_event_id = match payload.get("id") {
        None | Some(Value::Null) => {
            return Err(IngressError::Malformed(
                "payload has no id (the event GUID)",
            ))
        }
        Some(Value::String(s)) => bounded_id(s).ok_or(IngressError::Malformed(
            "payload id is not a short identifier",
        ))?,
        Some(_) => return Err(IngressError::Malformed("payload id is not a string")),
    };
    let event = match payload.get("eventType") {
        Some(Value::String(s)) if is_event_type(s) => s.clone(),
        None | Some(Value::Null) => {
            return Err(IngressError::Malformed("payload has no eventType"))
        }
        Some(_) => {
            return Err(IngressError::Malformed(
                "payload eventType is not a short dotted name",
            ))
        }
    };
    let fields = normalize(&payload, &event);
    Ok(Verified {
        provider_event_id,
        event: NormalizedEvent {
            event,
            action: None,
            fields,
        },
    })
}

/// The `Authorization` value Azure DevOps sends for a service hook with `basicAuthUsername` /
/// `basicAuthPassword`: `Basic ` + standard base64 of `username ":" password` (RFC 7617).
pub fn basic_authorization(username: &str, password: &[u8]) -> String {
    let mut raw = Vec::with_capacity(username.len() + 1 + password.len());
    raw.extend_from_slice(username.as_bytes());
    raw.push(b':');
    raw.extend_from_slice(password);
    format!("Basic {}", STANDARD.encode(raw))
}
