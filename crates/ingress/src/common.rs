//! Helpers shared by the connectors: strict single-valued header lookup, the content-encoding rule,
//! bounded identifiers and timestamp freshness. Private to the crate.

use http::HeaderMap;

use tb_core::limits::{check_json, JsonLimits, JsonRefusal};

use crate::IngressError;

/// Parses an authentic JSON body after [`check_json`] against `limits`, so nothing is built from a
/// body over them. Errors: [`IngressError::TooLarge`] (a limit), [`IngressError::Malformed`] with
/// `why` (not UTF-8, or not JSON of type `T`).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
    limits: &JsonLimits,
    why: &'static str,
) -> Result<T, IngressError> {
    check_limits(body, limits)?;
    serde_json::from_slice(body).map_err(|_| IngressError::Malformed(why))
}

/// [`check_json`] as a connector's error: [`IngressError::TooLarge`] over a limit,
/// [`IngressError::Malformed`] for a body that is not UTF-8.
pub(crate) fn check_limits(body: &[u8], limits: &JsonLimits) -> Result<(), IngressError> {
    check_json(body, limits).map_err(|r| match r {
        JsonRefusal::Exceeded(e) => IngressError::TooLarge(e),
        JsonRefusal::InvalidUtf8 => IngressError::Malformed("body is not valid UTF-8"),
    })
}

/// Result of looking up a header that must appear at most once.
pub(crate) enum Header<'a> {
    /// The header is absent.
    Missing,
    /// The header is repeated, or its value is not visible ASCII (plus space / tab).
    Invalid,
    /// The single value, untrimmed.
    Value(&'a str),
}

/// Looks `name` up case-insensitively; a repeated header is [`Header::Invalid`] (signals-and-connectors
/// §4.3: each allowlisted header present at most once). An invalid header name (e.g. from config) is
/// reported as missing.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Header<'a> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Header::Missing;
    };
    if values.next().is_some() {
        return Header::Invalid;
    }
    match first.to_str() {
        Ok(s) => Header::Value(s),
        Err(_) => Header::Invalid,
    }
}

/// Refuses compressed bodies (signals-and-connectors §0.3: decompression bombs): every `Content-Encoding`
/// token must be `identity` (case-insensitive) or empty. Errors: [`IngressError::UnsupportedMediaType`].
pub(crate) fn require_identity_encoding(headers: &HeaderMap) -> Result<(), IngressError> {
    for value in headers.get_all(http::header::CONTENT_ENCODING) {
        let Ok(s) = value.to_str() else {
            return Err(IngressError::UnsupportedMediaType(
                "unreadable Content-Encoding",
            ));
        };
        for token in s.split(',').map(str::trim) {
            if !token.is_empty() && !token.eq_ignore_ascii_case("identity") {
                return Err(IngressError::UnsupportedMediaType(
                    "compressed bodies are not accepted (Content-Encoding must be identity)",
                ));
            }
        }
    }
    Ok(())
}

/// A delivery / event identifier: trimmed, 1..=128 characters, each visible ASCII (`0x21..=0x7E`, so no
/// spaces or control characters). `None` when the value does not qualify.
pub(crate) fn bounded_id(raw: &str) -> Option<String> {
    let s = raw.trim();
    let ok = !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| (0x21..=0x7e).contains(&b));
    ok.then(|| s.to_owned())
}

/// Parses a Unix-seconds timestamp strictly: 1..=19 ASCII digits only (no sign, spaces, decimals or
/// exponent) and no `i64` overflow. `None` otherwise; never panics.
pub(crate) fn parse_unix_seconds(raw: &str) -> Option<i64> {
    if raw.is_empty() || raw.len() > 19 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse::<i64>().ok()
}

/// `|now - ts| <= tolerance_s`, inclusive in both directions, computed without overflow.
pub(crate) fn within_tolerance(ts: i64, now: i64, tolerance_s: u64) -> bool {
    (i128::from(now) - i128::from(ts)).unsigned_abs() <= u128::from(tolerance_s)
}

/// `Content-Type` must be `application/json` (parameters allowed) or absent; anything else is 415.
pub(crate) fn require_json_content_type(
    headers: &HeaderMap,
    why: &'static str,
) -> Result<(), IngressError> {
    match header(headers, http::header::CONTENT_TYPE.as_str()) {
        Header::Missing => Ok(()),
        Header::Invalid => Err(IngressError::UnsupportedMediaType(
            "unreadable Content-Type",
        )),
        Header::Value(v) => {
            let essence = v.split(';').next().unwrap_or("").trim();
            if essence.eq_ignore_ascii_case("application/json") {
                Ok(())
            } else {
                Err(IngressError::UnsupportedMediaType(why))
            }
        }
    }
}
