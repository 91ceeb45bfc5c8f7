//! Wrong API keys per client address (docs/limits.md, "Wrong API keys"): the rule.
//!
//! A wrong key presented to the API (`Authorization: Bearer`) or to the console's login form counts
//! against the client address it came from ([`crate::rate::source_key`]: an IPv4 address, an IPv6
//! /64). The count runs in a fixed window of [`WINDOW_MS`] that starts at the address's first wrong
//! key; once an address has `limit` wrong keys in its window, every key it presents is refused (429,
//! `Retry-After` = the seconds left in the window) until the window ends, a right key too: were a
//! right key let through, the answer would still tell a right guess from a wrong one, and guessing
//! would go on at full speed. A right key neither counts nor resets the window. Nothing here does I/O;
//! the engine keeps the windows in memory, per replica.

/// The width of a window, in ms: one minute from an address's first wrong key.
pub const WINDOW_MS: i64 = 60_000;

/// Wrong keys one address may present per window before it is refused: 20. Keys are long random
/// strings, so nobody types twenty wrong ones in a minute; a guesser at thousands a second is held to
/// twenty a minute. `[rate_limits].failed_keys_per_min` sets it (0 = no limit).
pub const DEFAULT_LIMIT: u32 = 20;

/// One address's window: when it started (Unix ms) and the wrong keys counted in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start_ms: i64,
    pub failures: u32,
}

impl Window {
    /// Whether the window is over at `now_ms` (then it is forgotten: the address starts afresh).
    pub fn ended(&self, now_ms: i64) -> bool {
        now_ms >= self.start_ms.saturating_add(WINDOW_MS) || now_ms < self.start_ms
    }
}

/// Whether an address whose window is `w` may have a key checked at `now_ms` under `limit` (0 = no
/// limit). `Err(retry_after_s)`: refused, with the whole seconds left in the window (at least 1).
pub fn check(w: Option<Window>, now_ms: i64, limit: u32) -> Result<(), u64> {
    match w {
        Some(w) if limit > 0 && !w.ended(now_ms) && w.failures >= limit => {
            let left = w.start_ms + WINDOW_MS - now_ms;
            Err(((left + 999) / 1000).max(1) as u64)
        }
        _ => Ok(()),
    }
}

/// The window after one more wrong key at `now_ms`: a new window when there was none or it ended.
pub fn failed(w: Option<Window>, now_ms: i64) -> Window {
    match w {
        Some(w) if !w.ended(now_ms) => Window {
            start_ms: w.start_ms,
            failures: w.failures.saturating_add(1),
        },
        _ => Window {
            start_ms: now_ms,
            failures: 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_th_wrong_key_closes_the_window_until_it_ends() {
        let mut w = None;
        for i in 0..3 {
            assert_eq!(check(w, 1_000 + i, 3), Ok(()));
            w = Some(failed(w, 1_000 + i));
        }
        assert_eq!(
            w,
            Some(Window {
                start_ms: 1_000,
                failures: 3
            })
        );
        // Refused with the seconds left: 60 s from 1 000 ms, asked at 1 500 ms -> 59.5 s -> 60.
        assert_eq!(check(w, 1_500, 3), Err(60));
        assert_eq!(check(w, 60_999, 3), Err(1));
        // The window ends: checked again, and the next wrong key opens a new window.
        assert_eq!(check(w, 61_000, 3), Ok(()));
        assert_eq!(
            failed(w, 61_000),
            Window {
                start_ms: 61_000,
                failures: 1
            }
        );
        // No limit: never refused.
        assert_eq!(check(w, 1_500, 0), Ok(()));
        // A clock that went back ends the window rather than holding it longer.
        assert_eq!(check(w, 500, 3), Ok(()));
    }
}
