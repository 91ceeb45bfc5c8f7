//! Wrong API keys per client address, kept per replica (the rule: [`tb_core::failed_auth`];
//! docs/limits.md, "Wrong API keys").
//!
//! The API's bearer check and the console's login ask [`Engine::admit_key_check`] before they compare
//! a presented key and report a wrong one with [`Engine::key_check_failed`]. Each wrong key adds 1 to
//! `tb_auth_failures_total{surface}` and logs a `warn` line naming the client address; each key refused
//! unchecked adds 1 to `tb_auth_throttled_total{surface}` (not logged one by one: the line written when
//! the window closes says so), so the log holds at most `limit + 1` lines per address and window, and
//! at most one line a second for the clients counted together in the shared window
//! ([`OVERFLOW`]). The check and the count are two steps: requests in flight at the moment an
//! address reaches its limit may each still be checked once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use http::HeaderMap;
use tb_core::failed_auth::{self, Counted, Window};
use tb_core::rate;

use crate::{clock, Engine};

/// The key of the window shared by clients without a window of their own while the table is full
/// ([`failed_auth::Counted::Overflow`]); not an address, so never a real client's.
pub use crate::rate_limit::OVERFLOW;

/// Most addresses with an open window held at once: [`failed_auth::DEFAULT_CAPACITY`].
pub const MAX_ADDRESSES: usize = failed_auth::DEFAULT_CAPACITY;

/// Where a key was presented: the `surface` label of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `Authorization: Bearer` on an API route.
    Api,
    /// The console's login form.
    Console,
    /// `Authorization: Bearer tbres_...` on `POST /v1/runs/{id}/result`: a run's result token
    /// (docs/http-api.md, "Reporting a run's result").
    ResultToken,
}

impl Surface {
    /// `api`, `console` or `result_token`.
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Api => "api",
            Surface::Console => "console",
            Surface::ResultToken => "result_token",
        }
    }
}

/// The open windows by client key ([`rate::source_key`], or [`OVERFLOW`]) and when the table was
/// last swept of its ended windows.
struct Table {
    windows: HashMap<String, Window>,
    last_sweep_ms: i64,
    sweeps: u64,
}

impl Table {
    /// The key `client` is checked and counted under at `now_ms` ([`failed_auth::counted_under`]):
    /// its own, or [`OVERFLOW`] while the table holds `capacity` windows and `client` has none. A
    /// full table is swept of its ended windows first, at most once a second.
    fn key_of<'a>(&mut self, client: &'a str, now_ms: i64, capacity: usize) -> &'a str {
        let has_own = self.windows.contains_key(client);
        if failed_auth::counted_under(has_own, self.windows.len(), capacity) == Counted::Own {
            return client;
        }
        if failed_auth::interval_passed(self.last_sweep_ms, now_ms) {
            self.last_sweep_ms = now_ms;
            self.sweeps += 1;
            self.windows.retain(|_, w| !w.ended(now_ms));
        }
        match failed_auth::counted_under(false, self.windows.len(), capacity) {
            Counted::Own => client,
            Counted::Overflow => OVERFLOW,
        }
    }
}

/// The limit, the capacity and the open windows of one replica.
pub struct FailedKeys {
    limit: AtomicU32,
    capacity: usize,
    table: Mutex<Table>,
    /// When the shared window's last `warn` line was written (Unix ms), and the lines left out since.
    overflow_logged_ms: AtomicI64,
    overflow_unlogged: AtomicU64,
}

impl Default for FailedKeys {
    fn default() -> FailedKeys {
        FailedKeys::with_capacity(MAX_ADDRESSES)
    }
}

impl FailedKeys {
    /// Holds at most `capacity` windows (the shared one included; [`MAX_ADDRESSES`] by default),
    /// with the limit [`failed_auth::DEFAULT_LIMIT`].
    pub fn with_capacity(capacity: usize) -> FailedKeys {
        FailedKeys {
            limit: AtomicU32::new(failed_auth::DEFAULT_LIMIT),
            capacity,
            table: Mutex::new(Table {
                windows: HashMap::new(),
                last_sweep_ms: i64::MIN,
                sweeps: 0,
            }),
            overflow_logged_ms: AtomicI64::new(i64::MIN),
            overflow_unlogged: AtomicU64::new(0),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the wrong keys allowed per window (0 = no limit).
    pub fn set_limit(&self, per_window: u32) {
        self.limit.store(per_window, Ordering::Relaxed);
    }

    /// Whether `client` may have a key checked at `now_ms` ([`failed_auth::check`] on the window it
    /// is counted under). `Err(retry_after_s)`: refused unchecked.
    pub fn admit(&self, client: &str, now_ms: i64) -> Result<(), u64> {
        let limit = self.limit.load(Ordering::Relaxed);
        let mut t = self.table();
        let key = t.key_of(client, now_ms, self.capacity);
        failed_auth::check(t.windows.get(key).copied(), now_ms, limit)
    }

    /// Counts one wrong key from `client` at `now_ms`: the window it was counted in after the count,
    /// and whether that is the shared one ([`OVERFLOW`]).
    pub fn failed(&self, client: &str, now_ms: i64) -> (Window, bool) {
        let mut t = self.table();
        let key = t.key_of(client, now_ms, self.capacity);
        let w = failed_auth::failed(t.windows.get(key).copied(), now_ms);
        t.windows.insert(key.to_string(), w);
        (w, key == OVERFLOW)
    }

    /// How many times a full table was swept of its ended windows (at most one a second).
    pub fn sweeps(&self) -> u64 {
        self.table().sweeps
    }

    /// Whether the shared window's `warn` line may be written at `now_ms` (at most one a second):
    /// `Some(lines left out since the last one)`, or `None` (this one is left out and counted).
    fn overflow_line(&self, now_ms: i64) -> Option<u64> {
        let last = self.overflow_logged_ms.load(Ordering::Relaxed);
        if failed_auth::interval_passed(last, now_ms)
            && self
                .overflow_logged_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.overflow_unlogged.swap(0, Ordering::Relaxed))
        } else {
            self.overflow_unlogged.fetch_add(1, Ordering::Relaxed);
            None
        }
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
        self.failed_keys.set_limit(per_window);
    }

    /// Before a presented key is compared: `Err(retry_after_s)` when `client` (from
    /// [`Engine::client_key`]; `None`: not throttled) has had `[rate_limits].failed_keys_per_min`
    /// wrong keys in its window; the key must then be refused unchecked (429), right or wrong.
    pub fn admit_key_check(&self, client: Option<&str>, surface: Surface) -> Result<(), u64> {
        let Some(client) = client else { return Ok(()) };
        let verdict = self.failed_keys.admit(client, clock::now_ms());
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
        let (w, shared) = self.failed_keys.failed(client, now);
        if !shared {
            tracing::warn!(
                client,
                surface = surface.as_str(),
                failures = w.failures,
                limit,
                "wrong API key"
            );
        } else if let Some(unlogged) = self.failed_keys.overflow_line(now) {
            tracing::warn!(
                client,
                window = OVERFLOW,
                surface = surface.as_str(),
                failures = w.failures,
                limit,
                unlogged,
                "wrong API key, counted in the window shared by new addresses while the table of addresses is full (at most one such line a second; unlogged = the lines left out since the last)"
            );
        }
        if limit > 0 && w.failures == limit {
            tracing::warn!(
                client,
                window = if shared { OVERFLOW } else { client },
                surface = surface.as_str(),
                retry_after_s = failed_auth::check(Some(w), now, limit).err().unwrap_or(1),
                "too many wrong API keys from this address: every key it presents is refused (429) until its window ends"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of 3 windows, limit 2, full with `a`, `b`, `c` at 0 ms.
    fn full() -> FailedKeys {
        let k = FailedKeys::with_capacity(3);
        k.set_limit(2);
        for c in ["a", "b", "c"] {
            assert_eq!(
                k.failed(c, 0),
                (
                    Window {
                        start_ms: 0,
                        failures: 1
                    },
                    false
                )
            );
        }
        k
    }

    #[test]
    fn past_the_capacity_new_addresses_are_refused_once_the_shared_window_is_at_the_limit() {
        let k = full();
        // `d` has no window and the table is full: its wrong keys go to the shared window ...
        assert_eq!(k.admit("d", 10), Ok(()));
        assert_eq!(
            k.failed("d", 10),
            (
                Window {
                    start_ms: 10,
                    failures: 1
                },
                true
            )
        );
        assert_eq!(k.admit("d", 11), Ok(()));
        assert_eq!(
            k.failed("d", 11),
            (
                Window {
                    start_ms: 10,
                    failures: 2
                },
                true
            )
        );
        // ... which now refuses `d` and every other address without a window (60 s from 10 ms).
        assert_eq!(k.admit("d", 20), Err(60));
        assert_eq!(k.admit("e", 20), Err(60));
        // Addresses with a window of their own are judged by it alone.
        assert_eq!(k.admit("a", 20), Ok(()));
        // Once the windows have ended, the table is swept and `d` gets a window of its own.
        assert_eq!(k.admit("d", 60_010), Ok(()));
        assert_eq!(
            k.failed("d", 60_010),
            (
                Window {
                    start_ms: 60_010,
                    failures: 1
                },
                false
            )
        );
    }

    #[test]
    fn a_full_table_is_swept_at_most_once_a_second() {
        let k = full();
        k.set_limit(0);
        for i in 0..1_000 {
            let client = format!("10.0.{}.{}", i / 256, i % 256);
            let now = 100 + i / 2;
            let _ = k.admit(&client, now);
            k.failed(&client, now);
        }
        // 2 000 lookups of new addresses from 100 ms to 599 ms: one sweep (which found nothing ended).
        assert_eq!(k.sweeps(), 1);
        assert_eq!(k.table().windows.len(), 4);
        assert_eq!(k.table().windows[OVERFLOW].failures, 1_000);
        k.failed("10.9.9.9", 1_099);
        assert_eq!(k.sweeps(), 1);
        k.failed("10.9.9.9", 1_100);
        assert_eq!(k.sweeps(), 2);
    }

    #[test]
    fn the_shared_window_logs_at_most_one_line_a_second() {
        let k = full();
        assert_eq!(k.overflow_line(1_000), Some(0));
        assert_eq!(k.overflow_line(1_500), None);
        assert_eq!(k.overflow_line(1_999), None);
        assert_eq!(k.overflow_line(2_000), Some(2));
        assert_eq!(k.overflow_line(2_001), None);
    }
}
