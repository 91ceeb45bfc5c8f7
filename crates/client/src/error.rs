//! The client's errors: what the API refused (with its stable machine code), what never reached it,
//! and answers that were not the expected JSON.

use std::fmt;
use std::time::Duration;

use tb_core::ErrorCode;

/// A stable machine code from the API's error envelope `{error, message}`.
///
/// [`Code::Core`] holds the codes of `tb_core::ErrorCode` (the domain's); the others are the HTTP
/// layer's own (authentication, method, idempotency). A code this client does not know yet (a newer
/// server) is [`Code::Other`], never an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Code {
    /// A domain code, e.g. `not_found`, `validation_error`, `target_terminal`.
    Core(ErrorCode),
    /// 401: no API key, or not a key of this server.
    Unauthenticated,
    /// 405: the endpoint does not take that method.
    MethodNotAllowed,
    /// 501: an optional capability this server does not provide.
    CapabilityNotProvided,
    /// 409: this `Idempotency-Key` was used with a different request.
    IdempotencyKeyMismatch,
    /// 409: a request with this `Idempotency-Key` is still being processed (retried by the client).
    IdempotencyInFlight,
    /// 409: the first request with this key succeeded, and its answer held a secret shown once.
    IdempotencyReplyWithheld,
    /// Any other code, as sent.
    Other(String),
}

impl Code {
    /// Reads a wire code (`"not_found"` → `Code::Core(ErrorCode::NotFound)`).
    pub fn parse(s: &str) -> Code {
        if let Some(c) = ErrorCode::parse(s) {
            return Code::Core(c);
        }
        match s {
            "unauthenticated" => Code::Unauthenticated,
            "method_not_allowed" => Code::MethodNotAllowed,
            "capability_not_provided" => Code::CapabilityNotProvided,
            "idempotency_key_mismatch" => Code::IdempotencyKeyMismatch,
            "idempotency_in_flight" => Code::IdempotencyInFlight,
            "idempotency_reply_withheld" => Code::IdempotencyReplyWithheld,
            other => Code::Other(other.to_owned()),
        }
    }

    /// The wire string.
    pub fn as_str(&self) -> &str {
        match self {
            Code::Core(c) => c.as_str(),
            Code::Unauthenticated => "unauthenticated",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::CapabilityNotProvided => "capability_not_provided",
            Code::IdempotencyKeyMismatch => "idempotency_key_mismatch",
            Code::IdempotencyInFlight => "idempotency_in_flight",
            Code::IdempotencyReplyWithheld => "idempotency_reply_withheld",
            Code::Other(s) => s,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered non-2xx with its error envelope.
    #[error("{status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The envelope's `error`.
        code: Code,
        /// The envelope's `message` (what to fix; never inbound content).
        message: String,
        /// The `Retry-After` header, when sent (429, 503).
        retry_after: Option<Duration>,
    },
    /// A non-2xx answer without the envelope (a proxy's page, say): its first 200 characters.
    #[error("{status} from {url}: {body}")]
    Http {
        /// HTTP status.
        status: u16,
        /// The URL called.
        url: String,
        /// The body's start, control characters removed.
        body: String,
    },
    /// Nothing answered: the connection failed or the request timed out (after the retries).
    #[error("cannot reach {url}: {detail}")]
    Unreachable {
        /// The server's base URL.
        url: String,
        /// The innermost cause.
        detail: String,
    },
    /// The request or the answer broke off midway (after the retries).
    #[error("request to {url} failed: {detail}")]
    Transport {
        /// The server's base URL.
        url: String,
        /// The innermost cause.
        detail: String,
    },
    /// A 2xx answer that is not the expected JSON shape.
    #[error("{url} answered {status} with a body that is not the expected JSON: {detail}")]
    Decode {
        /// The URL called.
        url: String,
        /// HTTP status.
        status: u16,
        /// The decoder's complaint.
        detail: String,
    },
    /// The client was given something it cannot send (a base URL that does not parse, a header
    /// value that is not ASCII).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// The API's machine code, for [`Error::Api`].
    pub fn code(&self) -> Option<&Code> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, for an answer that came.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. }
            | Error::Http { status, .. }
            | Error::Decode { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether this is the API's `code` (`err.is(ErrorCode::NotFound)`).
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == Some(&Code::Core(code))
    }
}

/// The client's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_code_reads_back() {
        for c in ErrorCode::ALL {
            assert_eq!(Code::parse(c.as_str()), Code::Core(c));
            assert_eq!(Code::parse(c.as_str()).as_str(), c.as_str());
        }
        for s in [
            "unauthenticated",
            "method_not_allowed",
            "capability_not_provided",
            "idempotency_key_mismatch",
            "idempotency_in_flight",
            "idempotency_reply_withheld",
        ] {
            let c = Code::parse(s);
            assert!(!matches!(c, Code::Other(_)), "{s}");
            assert_eq!(c.as_str(), s);
        }
        assert_eq!(Code::parse("brand_new"), Code::Other("brand_new".into()));
    }
}
