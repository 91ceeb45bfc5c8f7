//! Typed Rust client for the trigger-bridge HTTP API.
//!
//! ```no_run
//! # async fn demo() -> tb_client::Result<()> {
//! use tb_client::{Client, RaiseSignal};
//! let api = Client::new("http://127.0.0.1:8080")?.with_api_key("tbk_...");
//! let raised = api
//!     .raise_signal("run_1", &RaiseSignal { name: "approved".into(), ..Default::default() })
//!     .await?;
//! println!("{} {}", raised.signal_id, raised.status);
//! # Ok(()) }
//! ```
//!
//! - **Shapes**: requests and answers are the structs the server itself serializes
//!   (`trigger-bridge-api-types`, re-exported here), so the two cannot drift. Answers the server
//!   builds as free JSON (run, subscription and list pages) come back as `serde_json::Value`.
//! - **Errors**: [`Error`]; an API refusal carries the stable machine [`Code`] and the HTTP status.
//! - **Retries**: every call is retried on a failed connection, 429, 502-504 and 409
//!   `idempotency_in_flight` ([`Retry`]); every mutating call carries an `Idempotency-Key`, the same on
//!   each retry, so a retried `POST` acts once.
//! - **Long-polls and streams**: [`Client::wait_for`] blocks until a wait resolves within a budget;
//!   [`Client::turns`] is the run's turns as a stream of claims; [`Client::signals`] pages the
//!   mailbox; [`Client::run_events`] is the run's Server-Sent Events.
//!
//! Anything not covered by a typed method is one [`Call`] away: `api.send(Call::get("/v1/audit"))`.

mod call;
mod error;
mod events;
mod operator;
mod sessions;

use std::time::Duration;

pub use call::{seg, Call, Reply, Retry};
pub use error::{Code, Error, Result};
pub use events::RunEvent;
/// The HTTP method of a [`Call`].
pub use reqwest::Method;
/// Every wire shape, by module (`types::sessions::Wait`, ...).
pub use tb_api_types as types;
pub use tb_api_types::{
    ArmWait, AttemptView, DeliveryDetail, DeliveryView, ErrorBody, KeyInfo, ListQuery, Prompt,
    RaiseSignal, ReceiptDetail, ReceiptView, ReplayFilter, ReplayOutcome, ReplayRequest,
    ReplaySkip, RunCreated, SessionSignalV1, SignalEntry, SignalPage, SignalRaised, Turn, TurnList,
    Wait, WaitAction, WaitList, Winner,
};
pub use tb_core::ErrorCode;

/// A client of one server. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    api_key: Option<String>,
    http: reqwest::Client,
    retry: Retry,
    timeout: Duration,
}

/// The longest a server long-poll holds (`?timeout=` is clamped to it), s.
pub const LONG_POLL_MAX_S: u64 = 60;

/// What a request may take beyond the server's long-poll wait.
const LONG_POLL_MARGIN: Duration = Duration::from_secs(10);

impl Client {
    /// A client of the API at `base` (`http://host:port`, no path). Defaults: no API key, 60 s per
    /// request, 5 s to connect, [`Retry::default`]. Errors: [`Error::Invalid`] for a `base` that is not
    /// an `http(s)` URL.
    pub fn new(base: &str) -> Result<Client> {
        let url = reqwest::Url::parse(base)
            .map_err(|e| Error::Invalid(format!("server URL {base:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(Error::Invalid(format!(
                "server URL {base:?}: use http://host:port or https://host"
            )));
        }
        // The URL is named in every connection error: it must carry nothing secret (the key goes
        // in `with_api_key`), and nothing a request path would lose.
        if !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(Error::Invalid(
                "server URL: give only scheme, host, port and path (no user:password@, ?query or \
                 #fragment); an API key goes in --api-key / TRIGGER_BRIDGE_API_KEY"
                    .into(),
            ));
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("trigger-bridge-client/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Invalid(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            base: base.trim_end_matches('/').to_owned(),
            api_key: None,
            http,
            retry: Retry::default(),
            timeout: Duration::from_secs(60),
        })
    }

    /// Sends `Authorization: Bearer <key>` on every call.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Client {
        self.api_key = Some(key.into());
        self
    }

    /// The retry policy.
    pub fn with_retry(mut self, retry: Retry) -> Client {
        self.retry = retry;
        self
    }

    /// The timeout of a call that sets none (default 60 s).
    pub fn with_timeout(mut self, t: Duration) -> Client {
        self.timeout = t;
        self
    }

    /// The base URL, without a trailing `/`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether an API key is set.
    pub fn has_api_key(&self) -> bool {
        self.api_key.is_some()
    }

    /// Sends `call` (retried by the policy) and returns the 2xx answer. Errors: [`Error`].
    pub async fn send(&self, call: Call) -> Result<Reply> {
        let url = format!("{}{}", self.base, call.path);
        let key = call.is_mutating().then(|| {
            call.idempotency_key
                .clone()
                .unwrap_or_else(|| format!("tbc-{}", uuid::Uuid::new_v4()))
        });
        self.retrying(|| async {
            let resp = self.start(&call, &url, key.as_deref(), true).await?;
            self.read(resp, &url).await
        })
        .await
    }

    /// Runs `attempt` until it succeeds or [`Retry::delay`] says stop (then its last error).
    pub(crate) async fn retrying<T, F, Fut>(&self, attempt: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut tries = 0;
        loop {
            match attempt().await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tries += 1;
                    match self.retry.delay(tries, &e) {
                        Some(d) => tokio::time::sleep(d).await,
                        None => return Err(e),
                    }
                }
            }
        }
    }

    /// Sends `call` and decodes its 2xx JSON answer.
    pub async fn json<T: serde::de::DeserializeOwned>(&self, call: Call) -> Result<T> {
        self.send(call).await?.json()
    }

    /// One try: the response of a 2xx status (body unread), or the error an answer or its absence
    /// makes. `timed` false leaves the body unbounded in time (a stream).
    pub(crate) async fn start(
        &self,
        call: &Call,
        url: &str,
        idempotency_key: Option<&str>,
        timed: bool,
    ) -> Result<reqwest::Response> {
        let mut req = self
            .http
            .request(call.method.clone(), url)
            .query(&call.query);
        if timed {
            req = req.timeout(call.timeout.unwrap_or(self.timeout));
        }
        if let Some(b) = &call.body {
            req = req.json(b);
        }
        if let Some(k) = &self.api_key {
            req = req.bearer_auth(k);
        }
        for (name, value) in &call.headers {
            req = req.header(*name, value);
        }
        if let Some(k) = idempotency_key {
            req = req.header("idempotency-key", k);
        }
        let resp = req.send().await.map_err(|e| self.transport(e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = resp.text().await.unwrap_or_default();
        Err(match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => Error::Api {
                status: status.as_u16(),
                code: Code::parse(&b.error),
                message: b.message,
                retry_after,
            },
            Err(_) => Error::Http {
                status: status.as_u16(),
                url: url.to_owned(),
                body: text
                    .trim()
                    .chars()
                    .take(200)
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect(),
            },
        })
    }

    async fn read(&self, resp: reqwest::Response, url: &str) -> Result<Reply> {
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.transport(e))?;
        Ok(Reply {
            status,
            text,
            url: url.to_owned(),
        })
    }

    fn transport(&self, e: reqwest::Error) -> Error {
        let mut cause: &dyn std::error::Error = &e;
        while let Some(next) = cause.source() {
            cause = next;
        }
        let (url, detail) = (self.base.clone(), cause.to_string());
        if e.is_builder() {
            return Error::Invalid(format!("cannot build the request: {detail}"));
        }
        if e.is_connect() || e.is_timeout() {
            Error::Unreachable { url, detail }
        } else {
            Error::Transport { url, detail }
        }
    }

    /// `GET /v1/auth/key`: the presented key's name and scopes (any key may ask).
    pub async fn key_info(&self) -> Result<KeyInfo> {
        self.json(Call::get("/v1/auth/key")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked() {
        assert_eq!(
            Client::new("http://127.0.0.1:8080/").unwrap().base(),
            "http://127.0.0.1:8080"
        );
        for bad in ["127.0.0.1:8080", "ftp://x", "not a url", "mailto:a@b"] {
            assert!(matches!(Client::new(bad), Err(Error::Invalid(_))), "{bad}");
        }
    }
}
