//! Wrong API keys per client address, kept per replica (the rule: [`tb_core::failed_auth`];
//! docs/limits.md, "Wrong API keys").
//!
//! The API's bearer check and the console's login ask [`Engine::admit_key_check`] before they compare
//! a presented key and report a wrong one with [`Engine::key_check_failed`]. Each wrong key adds 1 to
//! `tb_auth_failures_total{surface}` and logs a `warn` line naming the client address; each key refused
//! unchecked adds 1 to `tb_auth_throttled_total{surface}` (logged once, when the address's window
//! closes), so the log holds at most `limit + 1` lines per address and window. The check and the count
//! are two steps: requests in flight at the moment an address reaches its limit may each still be
//! checked once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use http::HeaderMap;
use tb_core::failed_auth::{self, Window};
use tb_core::rate;

use crate::{clock, Engine};

/// Most addresses with an open window held at once; past it (after forgetting the ended windows) new
/// addresses share one window, [`crate::rate_limit::OVERFLOW`], so a flood from many addresses cannot
/// grow memory (they are then limited together).
pub const MAX_ADDRESSES: usize = 10_000;

/// Where a key was presented: the `surface` label of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `Authorization: Bearer` on an API route.
    Api,
    /// The console's login form.
    Console,
}

impl Surface {
    /// `api` or `console`.
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Api => "api",
            Surface::Console => "console",
        }
    }
}

/// The limit and the open windows by client key ([`rate::source_key`]).
pub struct FailedKeys {
    limit: AtomicU32,
    windows: Mutex<HashMap<String, Window>>,
}

impl Default for FailedKeys {
    fn default() -> FailedKeys {
        FailedKeys {
            limit: AtomicU32::new(failed_auth::DEFAULT_LIMIT),
            windows: Mutex::default(),
        }
    }
}

impl FailedKeys {
    fn window(&self, client: &str) -> Option<Window> {
        self.windows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(client)
            .copied()
    }
}

impl Engine {
    /// The key a request's client is counted under: its address as [`Engine::client_addr`] reads it
    /// (the forwarded address only from a trusted proxy, in the configured header), grouped by
    /// [`rate::source_key`] (an IPv6 /64 is one client), as the rate limits count it. `None` without a
    /// peer address (an in-process call).
    pub fn client_key(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<String> {
        Some(rate::source_key(self.client_addr(peer?, headers)))
    }

    /// Sets how many wrong API keys one client address may present per window
    /// (`[rate_limits].failed_keys_per_min`; 0 = no limit). Default
    /// [`failed_auth::DEFAULT_LIMIT`].
    pub fn set_failed_keys_limit(&self, per_window: u32) {
        self.failed_keys.limit.store(per_window, Ordering::Relaxed);
    }

    /// Before a presented key is compared: `Err(retry_after_s)` when `client` (from
    /// [`Engine::client_key`]; `None`: not throttled) has had `[rate_limits].failed_keys_per_min`
    /// wrong keys in its window; the key must then be refused unchecked (429), right or wrong.
    pub fn admit_key_check(&self, client: Option<&str>, surface: Surface) -> Result<(), u64> {
        let Some(client) = client else { return Ok(()) };
        let limit = self.failed_keys.limit.load(Ordering::Relaxed);
        let verdict = failed_auth::check(self.failed_keys.window(client), clock::now_ms(), limit);
        if verdict.is_err() {
            metrics::counter!("tb_auth_throttled_total", "surface" => surface.as_str())
                .increment(1);
        }
        verdict
    }

    /// Counts one wrong key from `client` (`None`: counted in the metric only) and logs it; logs
    /// once more when the address reaches its limit.
    pub fn key_check_failed(&self, client: Option<&str>, surface: Surface) {
        metrics::counter!("tb_auth_failures_total", "surface" => surface.as_str()).increment(1);
        let Some(client) = client else {
            tracing::warn!(surface = surface.as_str(), "wrong API key");
            return;
        };
        let now = clock::now_ms();
        let limit = self.failed_keys.limit.load(Ordering::Relaxed);
        let w = {
            let mut windows = self
                .failed_keys
                .windows
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let mut key = client.to_string();
            if windows.len() >= MAX_ADDRESSES && !windows.contains_key(&key) {
                windows.retain(|_, w| !w.ended(now));
                if windows.len() >= MAX_ADDRESSES {
                    key = crate::rate_limit::OVERFLOW.to_string();
                }
            }
            let w = failed_auth::failed(windows.get(&key).copied(), now);
            windows.insert(key, w);
            w
        };
        tracing::warn!(
            client,
            surface = surface.as_str(),
            failures = w.failures,
            limit,
            "wrong API key"
        );
        if limit > 0 && w.failures == limit {
            tracing::warn!(
                client,
                surface = surface.as_str(),
                retry_after_s = failed_auth::check(Some(w), now, limit).err().unwrap_or(1),
                "too many wrong API keys from this address: every key it presents is refused (429) until its window ends"
            );
        }
    }
}
