//! Standard Webhooks secret parsing (signals-and-connectors §3.2): `whsec_` + standard base64 of a 24..=64
//! byte key, decoded strictly at configuration time. Error messages say what to fix and never echo the
//! secret.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// Prefix of a serialized Standard Webhooks symmetric secret.
pub const WHSEC_PREFIX: &str = "whsec_";
/// Smallest key size the Standard Webhooks specification allows, in bytes.
pub const MIN_KEY_BYTES: usize = 24;
/// Largest key size the Standard Webhooks specification allows, in bytes.
pub const MAX_KEY_BYTES: usize = 64;

/// Why a `whsec_` secret was refused. The messages are actionable and contain no part of the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretFormatError {
    /// The value (or the part after `whsec_`) is empty.
    #[error("secret is empty; a Standard Webhooks secret is whsec_ followed by standard base64 of 24 to 64 random bytes")]
    Empty,
    /// The value looks like a signature header entry (`v1,whsec_...`) rather than a secret.
    #[error("secret starts with a signature version (`v1,`); remove it: the secret itself starts with whsec_")]
    VersionPrefix,
    /// The value does not start with `whsec_`.
    #[error("secret must start with whsec_ followed by standard base64 of the key")]
    MissingPrefix,
    /// The value contains whitespace (often a copy/paste artefact).
    #[error("secret contains whitespace; remove spaces and line breaks")]
    Whitespace,
    /// The value uses the URL-safe alphabet (`-` or `_`) instead of standard base64.
    #[error("secret after whsec_ uses base64url characters (- or _); it must be standard base64 (+ and /, with = padding)")]
    Base64Url,
    /// The part after `whsec_` is not canonical, padded standard base64.
    #[error("secret after whsec_ is not valid standard base64 with = padding (a Standard Webhooks secret is whsec_ + base64 of 24 to 64 random bytes)")]
    InvalidBase64,
    /// The decoded key has a length outside 24..=64 bytes.
    #[error("secret decodes to {0} bytes; a Standard Webhooks secret is 24 to 64 bytes")]
    BadLength(usize),
}

/// Parses `whsec_<standard base64>` into the raw HMAC key (signals-and-connectors §3.2).
///
/// Strict: requires the `whsec_` prefix, canonical standard base64 with `=` padding (no base64url, no
/// whitespace, no trailing bits), and a decoded length of 24..=64 bytes.
///
/// Errors: [`SecretFormatError`], one variant per thing to fix.
pub fn parse_whsec(s: &str) -> Result<Vec<u8>, SecretFormatError> {
    if s.is_empty() {
        return Err(SecretFormatError::Empty);
    }
    if s.starts_with("v1,") || s.starts_with("v1a,") {
        return Err(SecretFormatError::VersionPrefix);
    }
    let Some(b64) = s.strip_prefix(WHSEC_PREFIX) else {
        return Err(SecretFormatError::MissingPrefix);
    };
    if b64.is_empty() {
        return Err(SecretFormatError::Empty);
    }
    if b64.chars().any(char::is_whitespace) {
        return Err(SecretFormatError::Whitespace);
    }
    if b64.contains(['-', '_']) {
        return Err(SecretFormatError::Base64Url);
    }
    // STANDARD requires canonical padding and rejects non-zero trailing bits.
    let key = STANDARD
        .decode(b64)
        .map_err(|_| SecretFormatError::InvalidBase64)?;
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key.len()) {
        return Err(SecretFormatError::BadLength(key.len()));
    }
    Ok(key)
}

/// Serializes a raw key as `whsec_` + standard base64 (with padding). The inverse of [`parse_whsec`] for
/// keys of 24..=64 bytes; no length check is made here.
pub fn format_whsec(key: &[u8]) -> String {
    format!("{WHSEC_PREFIX}{}", STANDARD.encode(key))
}
