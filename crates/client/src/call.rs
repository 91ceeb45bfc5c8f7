//! The one request layer: a [`Call`] (method, path, query, JSON body) is sent by
//! [`Client::send`](crate::Client::send) with the API key, an `Idempotency-Key` on every mutating
//! call (the same key on each retry, so a retried call acts once: the server's Layer-1 idempotency),
//! and retries with backoff on what is worth retrying.

use std::time::Duration;

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// One request to the API, built by the typed methods or by hand for an endpoint they do not cover.
#[derive(Debug, Clone)]
pub struct Call {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) body: Option<Value>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) headers: Vec<(&'static str, String)>,
}

impl Call {
    /// A call of `method` on `path` (`/v1/...`; path segments already escaped: [`seg`]).
    pub fn new(method: Method, path: impl Into<String>) -> Call {
        Call {
            method,
            path: path.into(),
            query: Vec::new(),
            body: None,
            timeout: None,
            idempotency_key: None,
            headers: Vec::new(),
        }
    }

    /// `GET path`.
    pub fn get(path: impl Into<String>) -> Call {
        Call::new(Method::GET, path)
    }

    /// `POST path`.
    pub fn post(path: impl Into<String>) -> Call {
        Call::new(Method::POST, path)
    }

    /// `DELETE path`.
    pub fn delete(path: impl Into<String>) -> Call {
        Call::new(Method::DELETE, path)
    }

    /// Adds `?key=value`.
    pub fn query(mut self, key: &str, value: impl ToString) -> Call {
        self.query.push((key.to_owned(), value.to_string()));
        self
    }

    /// Adds `?key=value` when `value` is `Some`.
    pub fn query_opt(self, key: &str, value: Option<impl ToString>) -> Call {
        match value {
            Some(v) => self.query(key, v),
            None => self,
        }
    }

    /// The JSON body. Errors: [`Error::Invalid`] when `body` does not serialize.
    pub fn json(mut self, body: &impl Serialize) -> Result<Call> {
        self.body = Some(
            serde_json::to_value(body)
                .map_err(|e| Error::Invalid(format!("the request body: {e}")))?,
        );
        Ok(self)
    }

    /// The JSON body, already a value.
    pub fn body(mut self, body: Value) -> Call {
        self.body = Some(body);
        self
    }

    /// This call's own timeout (a long-poll's server wait plus a margin), instead of the client's.
    pub fn timeout(mut self, t: Duration) -> Call {
        self.timeout = Some(t);
        self
    }

    /// This `Idempotency-Key` instead of a fresh one (1 to 255 URL-safe ASCII characters): to repeat a
    /// call across processes and get the first answer back.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Call {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Adds a request header (`name` in lower case).
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Call {
        self.headers.push((name, value.into()));
        self
    }

    /// Whether the call changes something (gets an `Idempotency-Key`).
    pub fn is_mutating(&self) -> bool {
        !matches!(self.method, Method::GET | Method::HEAD | Method::OPTIONS)
    }
}

/// A 2xx answer: its status and body text.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status (200, 201, 202, 204).
    pub status: u16,
    /// The body as sent (empty for 204).
    pub text: String,
    pub(crate) url: String,
}

impl Reply {
    /// The body as `T`. Errors: [`Error::Decode`].
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.text).map_err(|e| Error::Decode {
            url: self.url.clone(),
            status: self.status,
            detail: e.to_string(),
        })
    }

    /// The body as a JSON value (`Null` for an empty 204).
    pub fn value(&self) -> Result<Value> {
        if self.text.is_empty() && self.status == 204 {
            return Ok(Value::Null);
        }
        self.json()
    }
}

/// Percent-escapes one path segment (an id the caller was given), so it cannot add segments.
pub fn seg(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// When to try a call again. Retried: a connection that failed or broke off, 429, 502, 503, 504, and
/// 409 `idempotency_in_flight`; never another 4xx or a 500 (a retry would not change the answer).
/// The delay doubles from `base` up to `max`, or is the server's `Retry-After` when it sends one
/// (capped at `max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Tries after the first (0: never retry). Default 3.
    pub retries: u32,
    /// First delay. Default 200 ms.
    pub base: Duration,
    /// Longest delay. Default 5 s.
    pub max: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            retries: 3,
            base: Duration::from_millis(200),
            max: Duration::from_secs(5),
        }
    }
}

impl Retry {
    /// No retries.
    pub fn never() -> Retry {
        Retry {
            retries: 0,
            ..Retry::default()
        }
    }

    /// The delay before retry number `n` (from 1) after `err`, or `None` when `err` is not retried
    /// or the retries are spent.
    pub fn delay(&self, n: u32, err: &Error) -> Option<Duration> {
        if n > self.retries {
            return None;
        }
        let backoff = self.base.saturating_mul(1 << (n - 1).min(16)).min(self.max);
        match err {
            Error::Unreachable { .. } | Error::Transport { .. } => Some(backoff),
            Error::Api {
                status,
                code,
                retry_after,
                ..
            } if matches!(status, 429 | 502 | 503 | 504)
                || *code == crate::Code::IdempotencyInFlight =>
            {
                Some(retry_after.map_or(backoff, |r| r.min(self.max)))
            }
            Error::Http {
                status: 502..=504, ..
            } => Some(backoff),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;

    fn api(status: u16, code: &str, retry_after: Option<u64>) -> Error {
        Error::Api {
            status,
            code: Code::parse(code),
            message: String::new(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn retries_what_a_retry_can_change() {
        let r = Retry::default();
        let down = Error::Unreachable {
            url: "u".into(),
            detail: "refused".into(),
        };
        assert_eq!(r.delay(1, &down), Some(Duration::from_millis(200)));
        assert_eq!(r.delay(2, &down), Some(Duration::from_millis(400)));
        assert_eq!(r.delay(3, &down), Some(Duration::from_millis(800)));
        assert_eq!(r.delay(4, &down), None, "three retries, then the error");
        assert_eq!(
            r.delay(1, &api(503, "unavailable", Some(1))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            r.delay(1, &api(429, "rate_limited", Some(60))),
            Some(Duration::from_secs(5)),
            "Retry-After is capped at max"
        );
        assert_eq!(
            r.delay(1, &api(409, "idempotency_in_flight", None)),
            Some(Duration::from_millis(200))
        );
        for (s, c) in [
            (400, "validation_error"),
            (404, "not_found"),
            (409, "conflict"),
            (500, "internal"),
            (401, "unauthenticated"),
        ] {
            assert_eq!(r.delay(1, &api(s, c, None)), None, "{s} {c}");
        }
        assert_eq!(Retry::never().delay(1, &down), None);
    }

    #[test]
    fn calls_build() {
        let c = Call::post(format!("/v1/runs/{}/signals", seg("run 1/..")))
            .query("limit", 5)
            .query_opt("before", None::<String>);
        assert_eq!(c.path, "/v1/runs/run%201%2F%2E%2E/signals");
        assert_eq!(c.query, vec![("limit".to_string(), "5".to_string())]);
        assert!(c.is_mutating());
        assert!(!Call::get("/v1/runs").is_mutating());
    }
}
