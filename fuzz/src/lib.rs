//! What the fuzz targets share: one input's split into a request, and the one rule every connector
//! target checks.
//!
//! An input is `[flags][headers]\n\n[body]`: `flags` is the first byte (bit 0: add the header a
//! correct signature would carry, so the fuzzer reaches the code after the signature; bit 1: use tight
//! JSON limits), the header block is `name: value` lines (lines that are not a valid header are
//! skipped), the rest is the body. Without a blank line everything after the flags is the body.

use http::{HeaderMap, HeaderName, HeaderValue};
use tb_core::limits::JsonLimits;
use tb_ingress::{IngressError, Verified};

/// The secret every target signs with.
pub const SECRET: &[u8] = b"fuzz-secret-0123456789abcdef0123";
/// The verifier's clock (Unix s); signed inputs carry this timestamp.
pub const NOW: i64 = 1_700_000_000;

/// One fuzz input as a request.
pub struct Request<'a> {
    /// Add a correct signature.
    pub sign: bool,
    /// The limits to check under.
    pub limits: JsonLimits,
    /// The headers that parsed.
    pub headers: HeaderMap,
    /// The body.
    pub body: &'a [u8],
}

/// Splits `data` (see the crate docs).
pub fn split(data: &[u8]) -> Option<Request<'_>> {
    let (&flags, rest) = data.split_first()?;
    let (head, body) = match rest.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&rest[..i], &rest[i + 2..]),
        None => (&[][..], rest),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let limits = if flags & 2 != 0 {
        JsonLimits {
            max_depth: 4,
            max_string_bytes: 16,
            max_fields: 16,
        }
    } else {
        JsonLimits::default()
    };
    Some(Request {
        sign: flags & 1 != 0,
        limits,
        headers,
        body,
    })
}

/// Sets `name` to `value` (replacing what the input had), when `value` is a valid header value.
pub fn set(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(name, v);
    }
}

/// What every connector promises, whatever the input: no panic (the harness catches that), a
/// verified event whose provider id is 1..=128 visible ASCII, and an error message that never
/// echoes the body (its messages are static text).
pub fn check(r: &Result<Verified, IngressError>) {
    match r {
        Ok(v) => {
            let id = &v.provider_event_id;
            assert!(!id.is_empty() && id.len() <= 128, "id length {}", id.len());
            assert!(id.bytes().all(|b| (0x21..=0x7e).contains(&b)), "id {id:?}");
            assert!(!v.event.event.is_empty());
        }
        Err(e) => {
            let _ = e.code();
        }
    }
}
