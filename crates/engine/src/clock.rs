//! Wall clock in Unix milliseconds and seconds.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Added to the system clock by [`now_ms`]; 0 unless a test moved it.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
        + OFFSET_MS.load(Ordering::Relaxed)
}

/// Now, in Unix seconds.
pub fn now_s() -> i64 {
    now_ms() / 1000
}

/// Moves this process's clock forward by `ms` for everything that reads [`now_ms`]: for tests of what
/// happens in a later minute (rate limits recover, the quarantine rule looks back). The server never
/// calls it. A test binary that uses it must not run other clock-sensitive tests beside it.
#[doc(hidden)]
pub fn advance_for_tests(ms: i64) {
    OFFSET_MS.fetch_add(ms, Ordering::Relaxed);
}
