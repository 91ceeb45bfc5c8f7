//! The limits of one inbound request (signals-and-connectors §0.3: "limits on body size, JSON
//! nesting, string length and field count; unsupported content types and compressed bodies refused").
//!
//! [`Limits`] holds every per-subscription limit with its default (the `[limits]` table of the config
//! gives the global defaults, a subscription's own keys override them); [`check_json`] is the one
//! structural check of a JSON body, a single pass over the bytes that builds nothing, so a body is
//! refused before any parse whose memory or time would grow with the attack (a 25 MiB `[0,0,0,...]`
//! would be ~12 M `serde_json::Value`s, about 400 MB). `docs/limits.md` lists each limit, its default
//! and its answer.

use serde::{Deserialize, Serialize};

/// Default of `max_json_depth`: 64 nested objects / arrays (GitHub and Azure DevOps payloads nest
/// about 8 deep; serde_json's own recursion guard is 128).
pub const DEFAULT_MAX_JSON_DEPTH: u32 = 64;
/// Default of `max_json_string_bytes`: 1 MiB for one JSON string as sent (escapes counted as sent).
/// GitHub caps a pull request or comment body at 65 536 characters (up to 4 bytes each).
pub const DEFAULT_MAX_JSON_STRING_BYTES: usize = 1 << 20;
/// Default of `max_json_fields`: 100 000 values inside objects and arrays, all levels together (a
/// GitHub `push` with 20 commits has about 1 000).
pub const DEFAULT_MAX_JSON_FIELDS: usize = 100_000;
/// Default of `max_headers`: 100 request headers (hyper's own cap).
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// The server's own cap on headers of any request (the HTTP parser refuses more with 431 before
/// any handler runs); a subscription's `max_headers` is at most this.
pub const MAX_HEADERS_CAP: usize = 256;
/// Default of `max_header_bytes`: 32 KiB of header names and values together.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;
/// Default of `max_decompression_ratio`: a compressed body may expand at most 100 times.
pub const DEFAULT_MAX_DECOMPRESSION_RATIO: u32 = 100;

/// A content coding an operator may let a subscription accept (`content_encodings`); every other
/// `Content-Encoding` than `identity` is 415 `unsupported_media_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentCoding {
    /// RFC 9110 §8.4.1.3 `gzip` (also its alias `x-gzip`).
    Gzip,
}

impl ContentCoding {
    /// The coding a `Content-Encoding` token names, case-insensitively; `None` for anything else
    /// (`identity` included: that is no coding).
    pub fn parse(token: &str) -> Option<ContentCoding> {
        (token.eq_ignore_ascii_case("gzip") || token.eq_ignore_ascii_case("x-gzip"))
            .then_some(ContentCoding::Gzip)
    }
}

/// The structural limits of a JSON body ([`check_json`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonLimits {
    /// Most objects / arrays open at once.
    pub max_depth: u32,
    /// Longest string (a key or a value), in bytes as sent between its quotes.
    pub max_string_bytes: usize,
    /// Most values inside objects and arrays (members and elements), all levels together.
    pub max_fields: usize,
}

impl Default for JsonLimits {
    fn default() -> Self {
        JsonLimits {
            max_depth: DEFAULT_MAX_JSON_DEPTH,
            max_string_bytes: DEFAULT_MAX_JSON_STRING_BYTES,
            max_fields: DEFAULT_MAX_JSON_FIELDS,
        }
    }
}

/// Every limit of one subscription's requests besides `max_body_bytes` (which the catalog keeps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// The JSON structure limits.
    pub json: JsonLimits,
    /// Most request headers.
    pub max_headers: usize,
    /// Most bytes of header names and values together (each header counted as `name.len() +
    /// value.len()`).
    pub max_header_bytes: usize,
    /// Content codings accepted besides `identity`; empty (the default) refuses every compressed body.
    pub content_encodings: Vec<ContentCoding>,
    /// Most bytes a compressed body may decode to; `None`: the subscription's `max_body_bytes`.
    pub max_decompressed_bytes: Option<usize>,
    /// Most times a compressed body may expand (decoded bytes / received bytes).
    pub max_decompression_ratio: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            json: JsonLimits::default(),
            max_headers: DEFAULT_MAX_HEADERS,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            content_encodings: Vec::new(),
            max_decompressed_bytes: None,
            max_decompression_ratio: DEFAULT_MAX_DECOMPRESSION_RATIO,
        }
    }
}

impl Limits {
    /// What is wrong with these limits, for `check-config`: every count and size at least 1, a depth
    /// of at most 128 (serde_json's guard refuses deeper bodies anyway).
    pub fn validate(&self) -> Result<(), String> {
        let zero = [
            ("max_json_depth", self.json.max_depth as usize),
            ("max_json_string_bytes", self.json.max_string_bytes),
            ("max_json_fields", self.json.max_fields),
            ("max_headers", self.max_headers),
            ("max_header_bytes", self.max_header_bytes),
            (
                "max_decompression_ratio",
                self.max_decompression_ratio as usize,
            ),
        ];
        if let Some((k, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{k} must be at least 1"));
        }
        if self.max_decompressed_bytes == Some(0) {
            return Err("max_decompressed_bytes must be at least 1".into());
        }
        if self.max_headers > MAX_HEADERS_CAP {
            return Err(format!(
                "max_headers is {}; at most {MAX_HEADERS_CAP} (the server refuses more headers on any request)",
                self.max_headers
            ));
        }
        if self.json.max_depth > 128 {
            return Err(format!(
                "max_json_depth is {}; at most 128 (deeper JSON is refused by the parser anyway)",
                self.json.max_depth
            ));
        }
        Ok(())
    }

    /// Whether `coding` is accepted.
    pub fn accepts(&self, coding: ContentCoding) -> bool {
        self.content_encodings.contains(&coding)
    }
}

/// Which limit a request went over; each is answered with its own stable `limit` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// `max_json_depth`.
    JsonDepth,
    /// `max_json_string_bytes`.
    JsonString,
    /// `max_json_fields`.
    JsonFields,
    /// `max_headers`.
    Headers,
    /// `max_header_bytes`.
    HeaderBytes,
    /// `max_decompressed_bytes`.
    DecompressedBytes,
    /// `max_decompression_ratio`.
    DecompressionRatio,
}

impl Exceeded {
    /// The limit's config key, also the `limit` of the refusal's answer.
    pub fn key(self) -> &'static str {
        match self {
            Exceeded::JsonDepth => "max_json_depth",
            Exceeded::JsonString => "max_json_string_bytes",
            Exceeded::JsonFields => "max_json_fields",
            Exceeded::Headers => "max_headers",
            Exceeded::HeaderBytes => "max_header_bytes",
            Exceeded::DecompressedBytes => "max_decompressed_bytes",
            Exceeded::DecompressionRatio => "max_decompression_ratio",
        }
    }

    /// The HTTP status of the refusal: 431 for headers (RFC 6585 §5), 413 for the rest.
    pub fn status(self) -> u16 {
        self.error().code.http_status()
    }

    /// The refusal: `headers_too_large` (431) for headers, else `payload_too_large` (413), with a
    /// message naming the limit's key.
    pub fn error(self) -> crate::TbError {
        let code = match self {
            Exceeded::Headers | Exceeded::HeaderBytes => crate::ErrorCode::HeadersTooLarge,
            _ => crate::ErrorCode::PayloadTooLarge,
        };
        crate::TbError::new(
            code,
            format!(
                "the request is over this subscription's {} limit (docs/limits.md)",
                self.key()
            ),
        )
    }
}

/// Checks the header count and bytes of a request: `count` headers, `sizes` yielding each one's
/// `name.len() + value.len()`.
pub fn check_headers(
    count: usize,
    sizes: impl Iterator<Item = usize>,
    limits: &Limits,
) -> Result<(), Exceeded> {
    if count > limits.max_headers {
        return Err(Exceeded::Headers);
    }
    let mut total = 0usize;
    for n in sizes {
        total = total.saturating_add(n);
        if total > limits.max_header_bytes {
            return Err(Exceeded::HeaderBytes);
        }
    }
    Ok(())
}

/// Why [`check_json`] refused a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonRefusal {
    /// Over a limit.
    Exceeded(Exceeded),
    /// The body is not UTF-8 (so neither are its strings): RFC 8259 §8.1.
    InvalidUtf8,
}

/// One pass over a JSON body, before it is parsed: UTF-8 (RFC 8259 §8.1), the nesting depth, each
/// string's length and the count of values inside containers against `limits`. It builds nothing
/// and allocates nothing; it does not validate the grammar (the parser that follows does), so
/// unbalanced brackets or stray bytes are left to it. Time: one read of the body.
///
/// Errors: [`JsonRefusal`], the first limit met in the order of the bytes.
pub fn check_json(body: &[u8], limits: &JsonLimits) -> Result<(), JsonRefusal> {
    if std::str::from_utf8(body).is_err() {
        return Err(JsonRefusal::InvalidUtf8);
    }
    let over = |e| Err(JsonRefusal::Exceeded(e));
    let mut depth = 0u32;
    let mut fields = 0usize;
    // After an opening bracket: the next significant byte, unless it closes, is a first value.
    let mut opened = false;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            _ => {}
        }
        if opened {
            opened = false;
            if b != b'}' && b != b']' {
                fields += 1;
            }
        }
        match b {
            b'{' | b'[' => {
                depth += 1;
                if depth > limits.max_depth {
                    return over(Exceeded::JsonDepth);
                }
                opened = true;
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth > 0 => fields += 1,
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < body.len() && body[j] != b'"' {
                    j += if body[j] == b'\\' { 2 } else { 1 };
                }
                if j.min(body.len()) - start > limits.max_string_bytes {
                    return over(Exceeded::JsonString);
                }
                i = j + 1;
                continue;
            }
            _ => {}
        }
        if fields > limits.max_fields {
            return over(Exceeded::JsonFields);
        }
        i += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(depth: u32, string: usize, fields: usize) -> JsonLimits {
        JsonLimits {
            max_depth: depth,
            max_string_bytes: string,
            max_fields: fields,
        }
    }

    #[test]
    fn depth_counts_open_containers_not_brackets_inside_strings() {
        assert_eq!(check_json(br#"{"a":[{"b":1}]}"#, &l(3, 10, 10)), Ok(()));
        assert_eq!(
            check_json(br#"{"a":[{"b":[1]}]}"#, &l(3, 10, 10)),
            Err(JsonRefusal::Exceeded(Exceeded::JsonDepth))
        );
        assert_eq!(check_json(br#"{"a":"[[[[[[["}"#, &l(1, 10, 10)), Ok(()));
        let deep = "[".repeat(100_000);
        assert_eq!(
            check_json(deep.as_bytes(), &JsonLimits::default()),
            Err(JsonRefusal::Exceeded(Exceeded::JsonDepth))
        );
    }

    #[test]
    fn strings_are_measured_as_sent_with_escaped_quotes_inside() {
        assert_eq!(check_json(br#"{"k":"abcd"}"#, &l(2, 4, 10)), Ok(()));
        assert_eq!(
            check_json(br#"{"k":"abcde"}"#, &l(2, 4, 10)),
            Err(JsonRefusal::Exceeded(Exceeded::JsonString))
        );
        // `a\"b` is 4 bytes as sent; the escaped quote does not end the string.
        assert_eq!(check_json(br#"["a\"b"]"#, &l(2, 4, 10)), Ok(()));
        assert_eq!(
            check_json(br#"["a\"bc"]"#, &l(2, 4, 10)),
            Err(JsonRefusal::Exceeded(Exceeded::JsonString))
        );
        assert_eq!(
            check_json(br#"{"abcdef":1}"#, &l(2, 4, 10)),
            Err(JsonRefusal::Exceeded(Exceeded::JsonString)),
            "keys are strings too"
        );
        // An unterminated string is measured to the end (and left to the parser).
        assert_eq!(
            check_json(br#"["abcdefgh"#, &l(2, 4, 10)),
            Err(JsonRefusal::Exceeded(Exceeded::JsonString))
        );
        assert_eq!(check_json(br#"["ab\"#, &l(2, 4, 10)), Ok(()));
    }

    #[test]
    fn fields_count_members_and_elements_at_every_level() {
        assert_eq!(check_json(br#"{"a":1,"b":[1,2]}"#, &l(3, 10, 4)), Ok(()));
        assert_eq!(
            check_json(br#"{"a":1,"b":[1,2,3]}"#, &l(3, 10, 4)),
            Err(JsonRefusal::Exceeded(Exceeded::JsonFields))
        );
        assert_eq!(check_json(b"{ } [ ] {\"a\":[ ]}", &l(3, 10, 1)), Ok(()));
        assert_eq!(check_json(b"1", &l(1, 1, 0)), Ok(()), "a scalar holds none");
        let many = format!("[{}0]", "0,".repeat(200_000));
        assert_eq!(
            check_json(many.as_bytes(), &JsonLimits::default()),
            Err(JsonRefusal::Exceeded(Exceeded::JsonFields))
        );
    }

    #[test]
    fn invalid_utf8_inside_a_string_is_refused() {
        assert_eq!(
            check_json(b"{\"a\":\"\xff\xfe\"}", &JsonLimits::default()),
            Err(JsonRefusal::InvalidUtf8)
        );
        assert_eq!(
            check_json("{\"a\":\"é😀\"}".as_bytes(), &JsonLimits::default()),
            Ok(())
        );
    }

    #[test]
    fn headers_are_counted_and_measured() {
        let lim = Limits {
            max_headers: 2,
            max_header_bytes: 10,
            ..Limits::default()
        };
        assert_eq!(check_headers(2, [4, 6].into_iter(), &lim), Ok(()));
        assert_eq!(
            check_headers(3, [1, 1, 1].into_iter(), &lim),
            Err(Exceeded::Headers)
        );
        assert_eq!(
            check_headers(2, [5, 6].into_iter(), &lim),
            Err(Exceeded::HeaderBytes)
        );
        assert_eq!(Exceeded::HeaderBytes.status(), 431);
        assert_eq!(Exceeded::JsonFields.status(), 413);
    }

    #[test]
    fn validate_names_the_key_to_fix() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let mut bad = Limits::default();
        bad.json.max_fields = 0;
        assert_eq!(
            bad.validate().unwrap_err(),
            "max_json_fields must be at least 1"
        );
        bad = Limits::default();
        bad.json.max_depth = 500;
        assert!(bad.validate().unwrap_err().contains("at most 128"));
        assert_eq!(ContentCoding::parse("GZIP"), Some(ContentCoding::Gzip));
        assert_eq!(ContentCoding::parse("identity"), None);
        assert_eq!(ContentCoding::parse("br"), None);
    }
}
