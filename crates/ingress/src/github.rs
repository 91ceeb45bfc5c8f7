//! GitHub webhooks connector (signals-and-connectors §1).
//!
//! Order: content type / encoding (415), then `X-Hub-Signature-256` over the exact raw body in constant
//! time (401), then the `X-GitHub-Event` / `X-GitHub-Delivery` headers and the body shape (malformed), then
//! normalization of the allowlisted scalar fields in [`FIELDS`].

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use http::HeaderMap;
use serde_json::Value;
use sha2::Sha256;
use tb_core::limits::JsonLimits;
use tb_core::normalized::NormalizedEvent;

use crate::common::{bounded_id, header, parse_json, require_identity_encoding, Header};
use crate::{IngressError, Verified};

type HmacSha256 = Hmac<Sha256>;

/// Header carrying `sha256=<hex HMAC-SHA256 of the raw body>` (signals-and-connectors §1.1, §1.2).
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// Legacy sha1 signature header; never accepted on its own (signals-and-connectors §1.2).
pub const LEGACY_SIGNATURE_HEADER: &str = "x-hub-signature";
/// Header naming the event (`pull_request`, `push`, `ping`, ...).
pub const EVENT_HEADER: &str = "x-github-event";
/// Header with the delivery GUID; stable across redeliveries, hence the dedup key (§1.3).
pub const DELIVERY_HEADER: &str = "x-github-delivery";

/// Longest string value copied into a normalized field, in characters. Longer strings are **skipped**
/// (the field is left out), never truncated: a truncated value could spuriously satisfy an equality filter.
pub const MAX_FIELD_STRING_CHARS: usize = 512;

/// Longest accepted `X-GitHub-Event` name and payload `action`, in bytes.
const MAX_NAME_LEN: usize = 128;

/// The normalized fields this connector may fill: dotted paths into the payload, copied only when present
/// and scalar (string of at most [`MAX_FIELD_STRING_CHARS`] characters, number, or boolean). Free text
/// such as `comment.body` is deliberately absent (signals-and-connectors §0.4, §1.6).
pub const FIELDS: &[&str] = &[
    "repository.full_name",
    "repository.id",
    "repository.default_branch",
    "sender.login",
    "number",
    "pull_request.number",
    "pull_request.state",
    "pull_request.head.sha",
    "pull_request.head.ref",
    "pull_request.base.ref",
    "pull_request.merged",
    "pull_request.draft",
    "issue.number",
    "issue.state",
    "ref",
    "before",
    "after",
    "created",
    "deleted",
    "forced",
    "check_run.id",
    "check_run.name",
    "check_run.status",
    "check_run.conclusion",
    "check_run.head_sha",
    "workflow_run.id",
    "workflow_run.status",
    "workflow_run.conclusion",
    "workflow_run.head_sha",
    "workflow_run.head_branch",
    "comment.id",
    "installation.id",
];

/// How the body is framed (signals-and-connectors §1.4).
#[derive(Clone, Copy)]
enum BodyKind {
    Json,
    Form,
}

/// `Content-Type` must be `application/json` (parameters such as `; charset=utf-8` allowed) or
/// `application/x-www-form-urlencoded`; a missing one is treated as JSON. Anything else is 415.
fn body_kind(headers: &HeaderMap) -> Result<BodyKind, IngressError> {
    let raw = match header(headers, http::header::CONTENT_TYPE.as_str()) {
        Header::Missing => return Ok(BodyKind::Json),
        Header::Invalid => {
            return Err(IngressError::UnsupportedMediaType(
                "unreadable Content-Type",
            ))
        }
        Header::Value(v) => v,
    };
    let essence = raw.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(BodyKind::Json)
    } else if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Ok(BodyKind::Form)
    } else {
        Err(IngressError::UnsupportedMediaType(
            "GitHub deliveries must be application/json or application/x-www-form-urlencoded",
        ))
    }
}

/// Checks `X-Hub-Signature-256` against HMAC-SHA256(secret, body) in constant time (§1.2). The hex is
/// decoded case-insensitively and the 32 decoded bytes are compared, so upper-case hex is accepted.
fn check_signature(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), IngressError> {
    if secret.is_empty() {
        return Err(IngressError::SignatureInvalid("no secret configured"));
    }
    let value = match header(headers, SIGNATURE_HEADER) {
        Header::Value(v) => v,
        Header::Invalid => {
            return Err(IngressError::SignatureInvalid(
                "X-Hub-Signature-256 is repeated or unreadable",
            ))
        }
        Header::Missing if headers.contains_key(LEGACY_SIGNATURE_HEADER) => {
            return Err(IngressError::SignatureInvalid(
                "only the legacy sha1 X-Hub-Signature is present; X-Hub-Signature-256 is required",
            ))
        }
        Header::Missing => {
            return Err(IngressError::SignatureInvalid(
                "missing X-Hub-Signature-256",
            ))
        }
    };
    let hex_part = value
        .trim()
        .strip_prefix("sha256=")
        .ok_or(IngressError::SignatureInvalid(
            "X-Hub-Signature-256 must start with sha256=",
        ))?;
    let mut given = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut given)
        .map_err(|_| IngressError::SignatureInvalid("X-Hub-Signature-256 is not 64 hex digits"))?;
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(body);
    mac.verify_slice(&given)
        .map_err(|_| IngressError::SignatureInvalid("X-Hub-Signature-256 does not match the body"))
}

/// Parses the verified body into a JSON object: JSON as is, or the `payload` field of a form body.
fn parse_payload(
    kind: BodyKind,
    body: &[u8],
    limits: &JsonLimits,
) -> Result<serde_json::Map<String, Value>, IngressError> {
    let value: Value = match kind {
        BodyKind::Json => parse_json(body, limits, "body is not valid JSON")?,
        BodyKind::Form => {
            let mut payloads = form_urlencoded::parse(body).filter(|(k, _)| k == "payload");
            let payload = payloads
                .next()
                .ok_or(IngressError::Malformed("form body has no payload field"))?
                .1;
            if payloads.next().is_some() {
                return Err(IngressError::Malformed(
                    "form body has more than one payload field",
                ));
            }
            parse_json(
                payload.as_bytes(),
                limits,
                "form payload field is not valid JSON",
            )?
        }
    };
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(IngressError::Malformed("payload is not a JSON object")),
    }
}

/// Walks a dotted path through nested objects.
fn lookup<'a>(root: &'a serde_json::Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut current = root.get(parts.next()?)?;
    for part in parts {
        current = current.as_object()?.get(part)?;
    }
    Some(current)
}

/// A copy of `v` when it may enter a normalized event: numbers, booleans and strings of at most
/// [`MAX_FIELD_STRING_CHARS`] characters. Null, objects, arrays and longer strings are skipped.
pub(crate) fn scalar(v: &Value) -> Option<Value> {
    match v {
        Value::Bool(_) | Value::Number(_) => Some(v.clone()),
        Value::String(s) if s.chars().count() <= MAX_FIELD_STRING_CHARS => Some(v.clone()),
        _ => None,
    }
}

/// A short event/action name: 1..=128 bytes of `[A-Za-z0-9_.-]`.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Verifies and normalizes one GitHub delivery (signals-and-connectors §1).
///
/// * `secret`: the webhook secret's UTF-8 bytes (an empty secret refuses everything).
/// * `body`: the exact raw request bytes; the signature covers them as sent (form bytes for form bodies).
///
/// Result: `provider_event_id` = trimmed `X-GitHub-Delivery` (1..=128 visible ASCII characters);
/// `event.event` = `X-GitHub-Event`; `event.action` = the payload's `action` string (`None` when absent,
/// always `None` for `ping`); `event.fields` = the [`FIELDS`] present as scalars.
///
/// Errors:
/// * [`IngressError::UnsupportedMediaType`]: content type other than JSON / form, or a `Content-Encoding`
///   other than `identity`.
/// * [`IngressError::SignatureInvalid`]: `X-Hub-Signature-256` missing (even if the legacy sha1 header is
///   present), repeated, malformed or not matching.
/// * [`IngressError::TooLarge`] (after authentication): the JSON (or the form's `payload`) is over
///   `limits`.
/// * [`IngressError::Malformed`] (after authentication): missing or invalid `X-GitHub-Event` /
///   `X-GitHub-Delivery`, body not a JSON object, form body without a single `payload` field, `action`
///   present but not a short name.
pub fn verify(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    limits: &JsonLimits,
) -> Result<Verified, IngressError> {
    let kind = body_kind(headers)?;
    require_identity_encoding(headers)?;
    check_signature(secret, headers, body)?;

    let event = match header(headers, EVENT_HEADER) {
        Header::Value(v) if is_name(v.trim()) => v.trim().to_owned(),
        Header::Missing => return Err(IngressError::Malformed("missing X-GitHub-Event")),
        _ => return Err(IngressError::Malformed("invalid X-GitHub-Event")),
    };
    let provider_event_id = match header(headers, DELIVERY_HEADER) {
        Header::Value(v) => {
            bounded_id(v).ok_or(IngressError::Malformed("invalid X-GitHub-Delivery"))?
        }
        Header::Missing => return Err(IngressError::Malformed("missing X-GitHub-Delivery")),
        Header::Invalid => return Err(IngressError::Malformed("invalid X-GitHub-Delivery")),
    };

    let payload = parse_payload(kind, body, limits)?;
    let action = match payload.get("action") {
        _ if event == "ping" => None,
        None | Some(Value::Null) => None,
        Some(Value::String(a)) if is_name(a) => Some(a.clone()),
        Some(_) => {
            return Err(IngressError::Malformed(
                "payload action is not a short name",
            ))
        }
    };
    let fields: BTreeMap<String, Value> = FIELDS
        .iter()
        .filter_map(|path| Some(((*path).to_owned(), scalar(lookup(&payload, path)?)?)))
        .collect();

    Ok(Verified {
        provider_event_id,
        event: NormalizedEvent {
            event,
            action,
            fields,
        },
    })
}

/// The `X-Hub-Signature-256` value GitHub would send for `body`: `sha256=` + lowercase hex of
/// HMAC-SHA256(key = `secret`, message = `body`) (signals-and-connectors §1.2).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}
