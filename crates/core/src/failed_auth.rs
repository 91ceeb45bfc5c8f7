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

/// Most client addresses one replica holds a window for: 10 000 (a window is about 100 bytes, so
/// about 1 MB). Past it a client with no window of its own is checked and counted in one shared
/// window ([`counted_under`]), so a flood from many addresses neither grows memory nor escapes the
/// limit.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// How often, at most, a full table is swept of its ended windows, in ms: once a second, so a flood
/// of new addresses against a full table costs one sweep a second, not one per request.
pub const SWEEP_INTERVAL_MS: i64 = 1_000;

/// Which window a client's key is checked against and a wrong key counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// The client's own window (it has one, or the table has room for a new one).
    Own,
    /// The one window shared by every client without a window of its own while the table holds
    /// `capacity` windows: `limit` wrong keys among all of them close it for all of them, a right
    /// key too, until it ends (docs/limits.md, "Wrong API keys").
    Overflow,
}

/// Where a client is counted: [`Counted::Own`] when it has a window (`has_own`) or the table holds
/// fewer than `capacity` windows (`held`, the shared window included); else [`Counted::Overflow`].
/// The caller sweeps ended windows first when [`interval_passed`] allows it.
pub fn counted_under(has_own: bool, held: usize, capacity: usize) -> Counted {
    if has_own || held < capacity {
        Counted::Own
    } else {
        Counted::Overflow
    }
}

/// Whether [`SWEEP_INTERVAL_MS`] has passed since `last_ms` (Unix ms; `i64::MIN`: never) at `now_ms`:
/// when a full table may be swept again, and when the shared window's next `warn` line may be
/// written. A clock that went back counts as passed.
pub fn interval_passed(last_ms: i64, now_ms: i64) -> bool {
    now_ms >= last_ms.saturating_add(SWEEP_INTERVAL_MS) || now_ms < last_ms
}

/// One address's window: when it started (Unix ms) and the wrong keys counted in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// When the window started, Unix ms (its first wrong key); it lasts [`WINDOW_MS`].
    pub start_ms: i64,
    /// Wrong keys counted in the window so far; past the limit the address is refused.
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

    #[test]
    fn a_client_without_a_window_is_counted_in_the_shared_one_only_while_the_table_is_full() {
        assert_eq!(counted_under(false, 2, 3), Counted::Own);
        assert_eq!(counted_under(true, 3, 3), Counted::Own);
        assert_eq!(counted_under(true, 9, 3), Counted::Own);
        assert_eq!(counted_under(false, 3, 3), Counted::Overflow);
        assert_eq!(counted_under(false, 4, 3), Counted::Overflow);
        // Swept at most once a second; never swept before counts as due.
        assert!(interval_passed(i64::MIN, 0));
        assert!(!interval_passed(5_000, 5_999));
        assert!(interval_passed(5_000, 6_000));
        assert!(interval_passed(5_000, 4_000));
    }
}
