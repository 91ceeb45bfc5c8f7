//! The `Idempotency-Key` rule, one for every path that honours the header: the management API's
//! Layer-1 idempotency (`tb_api::idempotency`, OpenWOP `spec/v1/idempotency.md`) and capability URLs
//! (`POST /v1/hooks/{token}`, signals-and-connectors §4.2). A key is 1 to [`MAX_KEY_LEN`] URL-safe
//! ASCII characters (letters, digits, `-_.~:`); anything else, and a request with two
//! `Idempotency-Key` headers, is 400 `validation_error`: never ignored, never "first one wins"
//! (a non-ASCII key on a capability URL used to be dropped, so a retry was
//! accepted twice).

use crate::error::{ErrorCode, TbError};

/// Longest key, in bytes (= characters: keys are ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// The message of a refused key.
pub const KEY_RULE: &str =
    "Idempotency-Key must be 1 to 255 URL-safe ASCII characters (letters, digits, -_.~:)";

/// The message of a request with more than one `Idempotency-Key` header.
pub const REPEATED: &str = "send one Idempotency-Key header, not several";

/// Whether `raw` (the header value's bytes) is a valid key: 1 to [`MAX_KEY_LEN`] bytes, each an
/// ASCII letter, digit or one of `-_.~:`.
pub fn valid_key(raw: &[u8]) -> bool {
    !raw.is_empty()
        && raw.len() <= MAX_KEY_LEN
        && raw
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~:".contains(b))
}

/// The key of a request from the raw bytes of each of its `Idempotency-Key` headers, in order:
/// `Ok(None)` without the header, `Ok(Some(key))` with one valid one. Errors (`validation_error`,
/// 400): a value that is not a valid key ([`KEY_RULE`]), or more than one header ([`REPEATED`]).
pub fn parse_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<&'a str>, TbError> {
    let mut values = values.into_iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(TbError::new(ErrorCode::ValidationError, REPEATED));
    }
    if !valid_key(first) {
        return Err(TbError::new(ErrorCode::ValidationError, KEY_RULE));
    }
    // Valid keys are ASCII, hence UTF-8.
    Ok(std::str::from_utf8(first).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_valid_key_is_taken_anything_else_is_refused() {
        assert_eq!(parse_key([]).unwrap(), None);
        assert_eq!(parse_key([&b"lp-1"[..]]).unwrap(), Some("lp-1"));
        assert_eq!(
            parse_key([&b"a.b_c~d:e-F9"[..]]).unwrap(),
            Some("a.b_c~d:e-F9")
        );
        let long = vec![b'k'; MAX_KEY_LEN];
        assert_eq!(parse_key([&long[..]]).unwrap().map(str::len), Some(255));
        let too_long = vec![b'k'; MAX_KEY_LEN + 1];
        for bad in [
            &b"\xff\xfe"[..],
            b"cl\xc3\xa9",
            b"has space",
            b"",
            b"a,b",
            b"a/b",
            &too_long,
        ] {
            let e = parse_key([bad]).unwrap_err();
            assert_eq!(e.code, ErrorCode::ValidationError, "{bad:?}");
            assert_eq!(e.message, KEY_RULE);
        }
        let e = parse_key([&b"k1"[..], b"k2"]).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::ValidationError, REPEATED)
        );
        let e = parse_key([&b"k1"[..], b"k1"]).unwrap_err();
        assert_eq!(e.message, REPEATED, "even two equal values");
    }
}
