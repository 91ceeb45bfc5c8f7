//! Signing-secret rotation with an overlap window (signals-and-connectors §0.3 "resolving a
//! reference per request allows rotation without restart"): while a rotation is in force a request is
//! authentic when it verifies with the current secret or, until the window ends, with the previous
//! one. The window is bounded so a forgotten rotation cannot keep an old secret alive.

/// The longest overlap: 30 days, in ms.
pub const MAX_OVERLAP_MS: i64 = 30 * 24 * 60 * 60 * 1000;

/// Checks a rotation's end `until_ms` at `now_ms` (both Unix ms): it must be in the future and at most
/// [`MAX_OVERLAP_MS`] away. Errors: what to change, as a sentence.
pub fn check_until(until_ms: i64, now_ms: i64) -> Result<(), String> {
    if until_ms <= now_ms {
        return Err(
            "the overlap has ended: remove [subscriptions.rotation] (the previous secret is no longer accepted)"
                .into(),
        );
    }
    if until_ms - now_ms > MAX_OVERLAP_MS {
        return Err(format!(
            "the overlap ends more than 30 days from now; end it sooner (at most {} days)",
            MAX_OVERLAP_MS / 86_400_000
        ));
    }
    Ok(())
}

/// Whether the previous secret of a rotation ending at `until_ms` is still accepted at `now_ms`.
pub fn previous_accepted(until_ms: i64, now_ms: i64) -> bool {
    now_ms < until_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_in_the_future_bounded_and_ends_exactly() {
        let now = 1_000_000;
        assert!(check_until(now + 1, now).is_ok());
        assert!(check_until(now + MAX_OVERLAP_MS, now).is_ok());
        assert!(check_until(now + MAX_OVERLAP_MS + 1, now)
            .unwrap_err()
            .contains("more than 30 days"));
        assert!(check_until(now, now).unwrap_err().contains("has ended"));
        assert!(previous_accepted(now + 1, now));
        assert!(!previous_accepted(now, now), "the end is exclusive");
    }
}
