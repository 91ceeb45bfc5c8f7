//! Stable machine error codes and the HTTP status each maps to (flat envelope `{error, message, details?}`,
//! OpenWOP core §errors; ingest answers per OpenWOP trigger-bridge §8 / RFC 0230).

use serde::Serialize;

/// A stable, machine-readable error code. The string form (`as_str`) is part of the public API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed or a parameter is invalid.
    ValidationError,
    /// 401: the webhook signature is missing, wrong, or its timestamp is outside the tolerance.
    SignatureInvalid,
    /// 404: no such resource.
    NotFound,
    /// 403: the API key lacks a scope the operation needs.
    Forbidden,
    /// 409: the subscription is paused (or otherwise not accepting work).
    SubscriptionNotActive,
    /// 403: the subscription is quarantined (`tb_core::quarantine`): every request is refused,
    /// before its body is read, until an operator releases it.
    SubscriptionQuarantined,
    /// 409: a state conflict (e.g. a result for a run that is already terminal).
    Conflict,
    /// 413: the body is larger than the subscription's `max_body_bytes`.
    PayloadTooLarge,
    /// 431: the request's headers are over the subscription's `max_headers` or `max_header_bytes`
    /// (RFC 6585 §5; docs/limits.md).
    HeadersTooLarge,
    /// 415: the connector does not take this content type or content encoding.
    UnsupportedMediaType,
    /// 422: the request is authentic but its event cannot be processed (e.g. missing event header).
    UnprocessableEvent,
    /// 409: the target run has ended (completed, failed or cancelled); a signal, prompt or wait can no
    /// longer reach it. Never 410 (Azure DevOps disables a hook that answers 410; signals-and-connectors §2.4).
    TargetTerminal,
    /// 409: a bulk dead-letter replay's `expect` differs from the count its filter selects now
    /// (crate::replay); nothing was replayed.
    ReplayCountChanged,
    /// 429: the run's signal mailbox is full and its overflow policy is `reject` (signals-and-connectors §5.2).
    SignalBufferFull,
    /// 429: a rate limit refused the request; retry after the `Retry-After` seconds.
    RateLimited,
    /// 408: the request body did not arrive in time: a gap between two chunks longer than
    /// `[server].body_timeout_ms`, or slower than `[server].body_min_rate_bytes_per_s` on average once
    /// `[server].body_min_rate_grace_ms` has passed since the headers. Senders retry.
    RequestTimeout,
    /// 503: storage is unavailable or shutting down; senders should retry.
    Unavailable,
    /// 500: an unexpected internal failure.
    Internal,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::ValidationError,
        ErrorCode::SignatureInvalid,
        ErrorCode::NotFound,
        ErrorCode::Forbidden,
        ErrorCode::SubscriptionNotActive,
        ErrorCode::SubscriptionQuarantined,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::HeadersTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::UnprocessableEvent,
        ErrorCode::TargetTerminal,
        ErrorCode::ReplayCountChanged,
        ErrorCode::SignalBufferFull,
        ErrorCode::RateLimited,
        ErrorCode::RequestTimeout,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ];

    /// The code whose wire string is `s` (the inverse of [`ErrorCode::as_str`]); `None` for a string
    /// that is no code of this enum (e.g. `unauthenticated`, which the auth layer answers).
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The wire string, e.g. `"signature_invalid"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ValidationError => "validation_error",
            ErrorCode::SignatureInvalid => "signature_invalid",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::SubscriptionNotActive => "subscription_not_active",
            ErrorCode::SubscriptionQuarantined => "subscription_quarantined",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::UnprocessableEvent => "unprocessable_event",
            ErrorCode::TargetTerminal => "target_terminal",
            ErrorCode::ReplayCountChanged => "replay_count_changed",
            ErrorCode::SignalBufferFull => "signal_buffer_full",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
        }
    }

    /// The HTTP status code this error is answered with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::ValidationError => 400,
            ErrorCode::SignatureInvalid => 401,
            ErrorCode::NotFound => 404,
            ErrorCode::Forbidden | ErrorCode::SubscriptionQuarantined => 403,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::SubscriptionNotActive
            | ErrorCode::Conflict
            | ErrorCode::TargetTerminal
            | ErrorCode::ReplayCountChanged => 409,
            ErrorCode::SignalBufferFull | ErrorCode::RateLimited => 429,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::UnprocessableEvent => 422,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }
}

/// A typed error with its stable code and a human message that says what to fix.
/// The message never contains inbound content (DESIGN §5.6).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct TbError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds the caller should wait before retrying (`Retry-After`), for 429 / 503 answers.
    pub retry_after_s: Option<u64>,
}

impl TbError {
    /// Builds an error from a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        TbError {
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// The same error with a `Retry-After` in seconds.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` names each code once, and `parse` inverts `as_str`. A new variant must be added to
    /// `as_str` (the match is exhaustive) and, for this test to count it, to `ALL`.
    #[test]
    fn every_code_parses_back() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "{c:?} twice in ALL");
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
        }
        assert_eq!(ErrorCode::parse("unauthenticated"), None);
    }
}
