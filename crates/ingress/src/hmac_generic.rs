//! Generic HMAC-SHA256 connector (`ConnectorSpec::Hmac`, see `tb_core::connector`).
//!
//! The MAC is HMAC-SHA256(secret, content) where content is the exact raw body, or `{timestamp}.{body}`
//! when `timestamp_header` is configured (the timestamp exactly as received). It travels in
//! `signature_header`, after the optional `signature_prefix`, as hex (case-insensitive) or standard base64.
//!
//! Decisions: when `id_header` or `event_header` is configured, the request must carry it (an authentic
//! request without it is [`IngressError::Malformed`]); a configured header is never silently replaced by
//! the defaults, which apply only when the header is not configured.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};
use tb_core::connector::{ConnectorSpec, SignatureEncoding};
use tb_core::normalized::NormalizedEvent;

use crate::common::{
    bounded_id, header, parse_unix_seconds, require_identity_encoding, within_tolerance, Header,
};
use crate::{IngressError, Verified};

type HmacSha256 = Hmac<Sha256>;

/// Event name when no `event_header` is configured.
pub const DEFAULT_EVENT: &str = "webhook";

/// The normalized fields this connector may fill: none. Routing sees only `event` (from `event_header` or
/// [`DEFAULT_EVENT`]); the body is opaque to this connector.
pub const FIELDS: &[&str] = &[];

fn mac(secret: &[u8], timestamp: Option<&str>, body: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    if let Some(ts) = timestamp {
        mac.update(ts.as_bytes());
        mac.update(b".");
    }
    mac.update(body);
    mac
}

/// Verifies one generic HMAC delivery against `spec` (which must be [`ConnectorSpec::Hmac`]).
///
/// * `secret`: the shared secret's bytes (an empty secret refuses everything).
/// * `now_unix_s`: the verifier's clock, Unix seconds; used only with `timestamp_header`.
///
/// Result: `provider_event_id` = the trimmed `id_header` value (1..=128 visible ASCII characters) when
/// configured, else `sha256:` + lowercase hex SHA-256 of the body (identical bodies are duplicates);
/// `event.event` = the `event_header` value (1..=128 visible ASCII characters) when configured, else
/// [`DEFAULT_EVENT`]; no action, no fields.
///
/// Errors: [`IngressError::UnsupportedMediaType`] for a `Content-Encoding` other than `identity`;
/// [`IngressError::SignatureInvalid`] for a missing / repeated / wrongly prefixed / undecodable signature
/// (it must decode to exactly 32 bytes), a missing or malformed timestamp (plain decimal digits only), a
/// timestamp more than `tolerance_s` seconds from `now_unix_s`, or a MAC mismatch;
/// [`IngressError::Malformed`] for a configured id / event header that is missing or invalid, or a `spec`
/// that is not `Hmac`.
pub fn verify(
    spec: &ConnectorSpec,
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now_unix_s: i64,
) -> Result<Verified, IngressError> {
    let ConnectorSpec::Hmac {
        signature_header,
        signature_prefix,
        encoding,
        timestamp_header,
        tolerance_s,
        id_header,
        event_header,
    } = spec
    else {
        return Err(IngressError::Malformed("connector is not hmac"));
    };
    require_identity_encoding(headers)?;
    if secret.is_empty() {
        return Err(IngressError::SignatureInvalid("no secret configured"));
    }

    let raw = match header(headers, signature_header) {
        Header::Value(v) => v.trim(),
        Header::Missing => return Err(IngressError::SignatureInvalid("missing signature header")),
        Header::Invalid => {
            return Err(IngressError::SignatureInvalid(
                "signature header is repeated or unreadable",
            ))
        }
    };
    let encoded = match signature_prefix.as_deref() {
        Some(prefix) => raw
            .strip_prefix(prefix)
            .ok_or(IngressError::SignatureInvalid(
                "signature lacks the configured prefix",
            ))?,
        None => raw,
    };
    let mut given = [0u8; 32];
    let decoded_ok = match encoding {
        SignatureEncoding::Hex => hex::decode_to_slice(encoded, &mut given).is_ok(),
        SignatureEncoding::Base64 => matches!(STANDARD.decode_slice(encoded, &mut given), Ok(32)),
    };
    if !decoded_ok {
        return Err(IngressError::SignatureInvalid(
            "signature does not decode to 32 bytes",
        ));
    }

    let timestamp = match timestamp_header {
        None => None,
        Some(name) => {
            let ts_raw = match header(headers, name) {
                Header::Value(v) => v,
                Header::Missing => {
                    return Err(IngressError::SignatureInvalid("missing timestamp header"))
                }
                Header::Invalid => {
                    return Err(IngressError::SignatureInvalid(
                        "timestamp header is repeated or unreadable",
                    ))
                }
            };
            let ts = parse_unix_seconds(ts_raw).ok_or(IngressError::SignatureInvalid(
                "timestamp must be Unix seconds as plain decimal digits",
            ))?;
            if !within_tolerance(ts, now_unix_s, *tolerance_s) {
                return Err(IngressError::SignatureInvalid(
                    "timestamp is outside the tolerance",
                ));
            }
            Some(ts_raw)
        }
    };
    mac(secret, timestamp, body)
        .verify_slice(&given)
        .map_err(|_| IngressError::SignatureInvalid("signature does not match the body"))?;

    let provider_event_id = match id_header {
        Some(name) => match header(headers, name) {
            Header::Value(v) => {
                bounded_id(v).ok_or(IngressError::Malformed("invalid id header"))?
            }
            Header::Missing => return Err(IngressError::Malformed("missing id header")),
            Header::Invalid => return Err(IngressError::Malformed("invalid id header")),
        },
        None => format!("sha256:{}", hex::encode(Sha256::digest(body))),
    };
    let event = match event_header {
        Some(name) => match header(headers, name) {
            Header::Value(v) => {
                bounded_id(v).ok_or(IngressError::Malformed("invalid event header"))?
            }
            Header::Missing => return Err(IngressError::Malformed("missing event header")),
            Header::Invalid => return Err(IngressError::Malformed("invalid event header")),
        },
        None => DEFAULT_EVENT.to_owned(),
    };

    Ok(Verified {
        provider_event_id,
        event: NormalizedEvent {
            event,
            action: None,
            fields: BTreeMap::new(),
        },
    })
}

/// The `signature_header` value a sender using `spec` would send: `signature_prefix` (if any) + hex
/// (lowercase) or standard base64 of HMAC-SHA256(secret, content), where content is `{timestamp}.{body}`
/// when `timestamp` is `Some` (decimal Unix seconds; pass it exactly when the spec has a
/// `timestamp_header`) and the body otherwise.
///
/// Panics if `spec` is not [`ConnectorSpec::Hmac`] (a programming error).
pub fn sign(spec: &ConnectorSpec, secret: &[u8], timestamp: Option<i64>, body: &[u8]) -> String {
    let ConnectorSpec::Hmac {
        signature_prefix,
        encoding,
        ..
    } = spec
    else {
        panic!("hmac_generic::sign needs an Hmac connector spec");
    };
    let ts = timestamp.map(|t| t.to_string());
    let out = mac(secret, ts.as_deref(), body).finalize().into_bytes();
    let encoded = match encoding {
        SignatureEncoding::Hex => hex::encode(out),
        SignatureEncoding::Base64 => STANDARD.encode(out),
    };
    format!("{}{encoded}", signature_prefix.as_deref().unwrap_or(""))
}
