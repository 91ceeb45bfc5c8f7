//! The `capability` connector (signals-and-connectors §4): minted URLs whose secret token is the
//! credential, with an optional HMAC over the exact raw body. Pure functions; the engine looks the
//! token up and commits.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::common::{header, require_identity_encoding, Header};
use crate::IngressError;
use tb_core::limits::JsonLimits;

/// Largest capability request body: 32 KiB (signals-and-connectors §4.2), in bytes.
pub const MAX_BODY_BYTES: usize = 32 * 1024;

/// The stored form of a token: lowercase hex SHA-256 of its UTF-8 bytes. Lookups compare hashes, so the
/// token itself is never stored or compared.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Checks `X-Signature-256: sha256=<hex HMAC-SHA256(secret, raw body)>` in constant time (hex decoded
/// case-insensitively). Errors: [`IngressError::SignatureInvalid`] when missing, repeated, malformed or
/// wrong.
pub fn verify_hmac(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), IngressError> {
    let v = match header(headers, "x-signature-256") {
        Header::Value(v) => v,
        Header::Missing => {
            return Err(IngressError::SignatureInvalid(
                "X-Signature-256 is required by this endpoint",
            ))
        }
        Header::Invalid => {
            return Err(IngressError::SignatureInvalid(
                "X-Signature-256 must appear once, in visible ASCII",
            ))
        }
    };
    let hex_sig = v
        .trim()
        .strip_prefix("sha256=")
        .ok_or(IngressError::SignatureInvalid(
            "X-Signature-256 must be sha256=<hex>",
        ))?;
    let sig = hex::decode(hex_sig.to_ascii_lowercase())
        .map_err(|_| IngressError::SignatureInvalid("X-Signature-256 is not hex"))?;
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    m.update(body);
    m.verify_slice(&sig)
        .map_err(|_| IngressError::SignatureInvalid("signature does not match the body"))
}

/// `sha256=<hex>` for `body` (the sender's side; used by `send` and tests).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("any key length");
    m.update(body);
    format!("sha256={}", hex::encode(m.finalize().into_bytes()))
}

/// Content rules after authentication: `Content-Type: application/json` (an optional `charset=utf-8`
/// only) and identity encoding (else 415), then the body parsed as JSON (else 422). The caller checks
/// the size ([`MAX_BODY_BYTES`]) first.
pub fn parse_body(
    headers: &HeaderMap,
    body: &[u8],
    limits: &JsonLimits,
) -> Result<Value, IngressError> {
    require_identity_encoding(headers)?;
    let ok = match header(headers, http::header::CONTENT_TYPE.as_str()) {
        Header::Value(v) => {
            let mut parts = v.split(';').map(str::trim);
            let essence = parts.next().unwrap_or("");
            essence.eq_ignore_ascii_case("application/json")
                && parts.all(|p| {
                    p.eq_ignore_ascii_case("charset=utf-8")
                        || p.eq_ignore_ascii_case("charset=\"utf-8\"")
                })
        }
        _ => false,
    };
    if !ok {
        return Err(IngressError::UnsupportedMediaType(
            "capability endpoints take Content-Type: application/json",
        ));
    }
    crate::common::parse_json(body, limits, "the body is not JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn hmac_over_raw_bytes() {
        let body = br#"{"status":"green"}"#;
        let sig = sign(b"k", body);
        assert!(verify_hmac(b"k", &h(&[("x-signature-256", &sig)]), body).is_ok());
        let upper = format!("sha256={}", sig[7..].to_uppercase());
        assert!(verify_hmac(b"k", &h(&[("x-signature-256", &upper)]), body).is_ok());
        assert!(verify_hmac(b"k", &h(&[("x-signature-256", &sig)]), b"{}").is_err());
        assert!(verify_hmac(b"other", &h(&[("x-signature-256", &sig)]), body).is_err());
        assert!(verify_hmac(b"k", &h(&[]), body).is_err());
        assert!(verify_hmac(b"k", &h(&[("x-signature-256", "sha1=00")]), body).is_err());
        assert!(
            verify_hmac(
                b"k",
                &h(&[("x-signature-256", &sig), ("x-signature-256", &sig)]),
                body
            )
            .is_err(),
            "a repeated header is refused"
        );
    }

    #[test]
    fn content_rules() {
        let ok = h(&[("content-type", "application/json; charset=utf-8")]);
        assert_eq!(
            parse_body(&ok, b"{\"a\":1}", &Default::default()).unwrap()["a"],
            1
        );
        assert!(matches!(
            parse_body(
                &h(&[("content-type", "text/plain")]),
                b"{}",
                &Default::default()
            ),
            Err(IngressError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            parse_body(&h(&[]), b"{}", &Default::default()),
            Err(IngressError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            parse_body(
                &h(&[
                    ("content-type", "application/json"),
                    ("content-encoding", "gzip")
                ]),
                b"{}",
                &Default::default()
            ),
            Err(IngressError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            parse_body(
                &h(&[("content-type", "application/json")]),
                b"{nope",
                &Default::default()
            ),
            Err(IngressError::Malformed(_))
        ));
        assert_eq!(hash_token("abc").len(), 64);
    }
}
