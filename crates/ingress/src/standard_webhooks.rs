//! Standard Webhooks v1 symmetric connector (signals-and-connectors §3).
//!
//! Signed content is `{webhook-id}.{webhook-timestamp}.{body}` over the exact body bytes; the MAC is
//! HMAC-SHA256 keyed with the base64-decoded `whsec_` secret (see [`crate::parse_whsec`]).
//!
//! Decisions:
//! * `webhook-id` must match the OpenWOP RFC 0230 pattern `^[A-Za-z0-9_-]{16,128}$` (which also rules out
//!   `.`, as the Standard Webhooks spec requires); every valid case of the fixture vectors satisfies it.
//! * A body that is not valid UTF-8 is refused deterministically: the signature is checked first (so an
//!   unauthenticated sender always gets [`IngressError::SignatureInvalid`]), then an authentic non-UTF-8
//!   body is [`IngressError::Malformed`]. The reference Rust library also rejects such bodies.
//! * The body does not have to be JSON: a non-JSON (UTF-8) body is accepted with event `webhook`.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use serde_json::Value;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};
use tb_core::limits::JsonLimits;
use tb_core::normalized::NormalizedEvent;

use crate::common::{
    header, parse_unix_seconds, require_identity_encoding, require_json_content_type,
    within_tolerance, Header,
};
use crate::github::scalar;
use crate::{IngressError, Verified};

type HmacSha256 = Hmac<Sha256>;

/// Message id header (Standard Webhooks §headers).
pub const ID_HEADER: &str = "webhook-id";
/// Unix-seconds timestamp header (Standard Webhooks §headers).
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Space-delimited `<version>,<base64>` signature list (Standard Webhooks §signature).
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// Longest accepted `webhook-signature` value, in bytes (signals-and-connectors §3.3: cap the header).
pub const MAX_SIGNATURE_HEADER_BYTES: usize = 8 * 1024;
/// Most non-empty entries accepted in `webhook-signature` (signals-and-connectors §3.3: cap candidates).
pub const MAX_SIGNATURE_ENTRIES: usize = 32;
/// Event name used when the body is not a JSON object with a string `type` field.
pub const DEFAULT_EVENT: &str = "webhook";

/// The normalized fields this connector may fill: the payload's top-level `type` (when it is a string of at
/// most 512 characters).
pub const FIELDS: &[&str] = &["type"];

/// OpenWOP RFC 0230: `^[A-Za-z0-9_-]{16,128}$`.
fn valid_msg_id(id: &str) -> bool {
    (16..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn mac(key: &[u8], msg_id: &str, timestamp: &str, body: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

fn required<'a>(
    headers: &'a HeaderMap,
    name: &str,
    missing: &'static str,
) -> Result<&'a str, IngressError> {
    match header(headers, name) {
        Header::Value(v) => Ok(v),
        Header::Missing => Err(IngressError::SignatureInvalid(missing)),
        Header::Invalid => Err(IngressError::SignatureInvalid(
            "a webhook-* header is repeated or unreadable",
        )),
    }
}

/// Verifies and normalizes one Standard Webhooks v1 delivery (signals-and-connectors §3).
///
/// * `key`: the raw HMAC key (base64-decoded `whsec_` secret); an empty key refuses everything.
/// * `tolerance_s`: allowed clock skew in seconds, inclusive in both directions (`|now - ts| <= tolerance`).
/// * `now_unix_s`: the verifier's clock, Unix seconds.
///
/// Rules: `webhook-id` matches `^[A-Za-z0-9_-]{16,128}$`; `webhook-timestamp` is 1..=19 decimal digits (no
/// sign, spaces or decimals); `webhook-signature` is at most [`MAX_SIGNATURE_HEADER_BYTES`] bytes with at
/// most [`MAX_SIGNATURE_ENTRIES`] non-empty space-separated entries; entries other than `v1,` are ignored;
/// each `v1` entry is standard base64 of 32 bytes compared in constant time; any match passes.
///
/// Result: `provider_event_id` = `webhook-id`; `event.event` = the payload's string `type` (1..=128 visible
/// ASCII characters) when the body is a JSON object carrying one, else [`DEFAULT_EVENT`]; `action` = `None`;
/// `fields["type"]` = that `type` when it is a string of at most 512 characters.
///
/// Errors: [`IngressError::UnsupportedMediaType`] for a `Content-Encoding` other than `identity`;
/// [`IngressError::SignatureInvalid`] for a missing / repeated / malformed header, a stale or future
/// timestamp, or no matching `v1` entry; [`IngressError::Malformed`] for an authentic body that is not
/// valid UTF-8.
///
/// After the signature, the body must be a JSON object (Standard Webhooks payloads are
/// `{type, timestamp, data}` JSON): an empty, non-JSON or non-object body is [`IngressError::Malformed`]
/// (422), and a `Content-Type` other than `application/json` (or none) is refused first (415).
pub fn verify(
    key: &[u8],
    tolerance_s: u64,
    headers: &HeaderMap,
    body: &[u8],
    now_unix_s: i64,
    limits: &JsonLimits,
) -> Result<Verified, IngressError> {
    require_identity_encoding(headers)?;
    require_json_content_type(headers, "Standard Webhooks payloads are application/json")?;
    let msg_id = verify_signature(key, tolerance_s, headers, body, now_unix_s)?;
    normalize(msg_id, body, limits)
}

/// The signature check alone (Standard Webhooks §verify): headers, freshness and a matching `v1` entry
/// over `{id}.{timestamp}.{body}`. Returns the `webhook-id`. Errors: [`IngressError::SignatureInvalid`].
/// This is what the reference vectors in `fixtures/standard-webhooks/` specify.
pub fn verify_signature<'h>(
    key: &[u8],
    tolerance_s: u64,
    headers: &'h HeaderMap,
    body: &[u8],
    now_unix_s: i64,
) -> Result<&'h str, IngressError> {
    if key.is_empty() {
        return Err(IngressError::SignatureInvalid("no key configured"));
    }
    let msg_id = required(headers, ID_HEADER, "missing webhook-id")?;
    let timestamp = required(headers, TIMESTAMP_HEADER, "missing webhook-timestamp")?;
    let signatures = required(headers, SIGNATURE_HEADER, "missing webhook-signature")?;

    if !valid_msg_id(msg_id) {
        return Err(IngressError::SignatureInvalid(
            "webhook-id must be 16 to 128 characters of A-Z a-z 0-9 _ -",
        ));
    }
    let ts = parse_unix_seconds(timestamp).ok_or(IngressError::SignatureInvalid(
        "webhook-timestamp must be Unix seconds as plain decimal digits",
    ))?;
    if !within_tolerance(ts, now_unix_s, tolerance_s) {
        return Err(IngressError::SignatureInvalid(
            "webhook-timestamp is outside the tolerance",
        ));
    }
    if signatures.len() > MAX_SIGNATURE_HEADER_BYTES {
        return Err(IngressError::SignatureInvalid(
            "webhook-signature is too long",
        ));
    }
    let entries: Vec<&str> = signatures.split(' ').filter(|e| !e.is_empty()).collect();
    if entries.len() > MAX_SIGNATURE_ENTRIES {
        return Err(IngressError::SignatureInvalid(
            "webhook-signature has too many entries",
        ));
    }

    let expected = mac(key, msg_id, timestamp, body);
    let mut matched = Choice::from(0);
    for entry in entries {
        let Some(("v1", b64)) = entry.split_once(',') else {
            continue;
        };
        let mut given = [0u8; 32];
        match STANDARD.decode_slice(b64, &mut given) {
            Ok(32) => matched |= expected.ct_eq(&given),
            _ => continue,
        }
    }
    if !bool::from(matched) {
        return Err(IngressError::SignatureInvalid(
            "no v1 entry of webhook-signature matches",
        ));
    }
    Ok(msg_id)
}

/// For subscriptions whose verification mode is `best-effort` or `none` (RFC 0099 §F.2): the request's
/// `webhook-id` (same pattern as [`verify`]) and normalized JSON-object body, without a signature check.
/// Errors: [`IngressError::Malformed`] (no valid `webhook-id`, or the body is not a JSON object),
/// [`IngressError::UnsupportedMediaType`].
pub fn read_unverified(
    headers: &HeaderMap,
    body: &[u8],
    limits: &JsonLimits,
) -> Result<Verified, IngressError> {
    require_identity_encoding(headers)?;
    require_json_content_type(headers, "Standard Webhooks payloads are application/json")?;
    let id = headers
        .get(ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| valid_msg_id(v))
        .ok_or(IngressError::Malformed(
            "webhook-id must be 16 to 128 characters of A-Z a-z 0-9 _ -",
        ))?;
    normalize(id, body, limits)
}

/// Builds the normalized event of an authentic body (see [`verify`]).
fn normalize(msg_id: &str, body: &[u8], limits: &JsonLimits) -> Result<Verified, IngressError> {
    crate::common::check_limits(body, limits)?;
    let text = std::str::from_utf8(body)
        .map_err(|_| IngressError::Malformed("body is not valid UTF-8"))?;
    // Only the allowlisted `type` is materialized; the rest of the object is scanned, not built.
    let not_object = IngressError::Malformed("Standard Webhooks payloads are JSON objects");
    if !text.trim_start().starts_with('{') {
        return Err(not_object);
    }
    let envelope: Envelope = serde_json::from_str(text).map_err(|_| not_object)?;
    let event_type = envelope.event_type;
    let mut fields = BTreeMap::new();
    let mut event = DEFAULT_EVENT.to_owned();
    if let Some(t) = event_type {
        if let Value::String(s) = &t {
            if !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
                event = s.clone();
            }
        }
        if let Some(v) = scalar(&t).filter(Value::is_string) {
            fields.insert("type".to_owned(), v);
        }
    }

    Ok(Verified {
        provider_event_id: msg_id.to_owned(),
        event: NormalizedEvent {
            event,
            action: None,
            fields,
        },
    })
}

/// The allowlisted part of a Standard Webhooks payload (`{type, timestamp, data}`).
#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(rename = "type", default)]
    event_type: Option<Value>,
}

/// One `webhook-signature` entry: `v1,` + standard base64 of HMAC-SHA256(key,
/// `"{msg_id}.{timestamp}.{body}"`), the timestamp written in decimal (Standard Webhooks §signature).
pub fn sign(key: &[u8], msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let mac = mac(key, msg_id, &timestamp.to_string(), body);
    format!("v1,{}", STANDARD.encode(mac))
}
