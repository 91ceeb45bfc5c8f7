//! Delivery leases (DESIGN §4 Delivery; architecture §9 step 2): which deliveries a worker may take, how
//! long it holds them, and when a renewal, a release or a completion is still its to make.
//!
//! A lease is fenced by a **token** minted per grant ([`grant`]): the worker carries it, every later
//! write about the lease (renew, release, the attempt's commit) must match the row's token, and a new
//! grant after a lapse replaces it, so a worker whose lease lapsed and moved on can no longer write
//! anything about that delivery, even when a later grant went to the same worker process. The store
//! applies these rules on the delivery row it locked (`SELECT ... FOR UPDATE` on PostgreSQL) and fences
//! its `UPDATE` on the token as well (`WHERE id = ?1 AND lease_token = ?2`): zero rows updated means the
//! race was lost ([`fenced`]).
//!
//! **Clock.** Every `now` here is the store's clock in Unix ms. The store passes the caller's (the
//! worker's) clock today (architecture §9): replicas keep their clocks close, a skew only lengthens or
//! shortens a lease, and the token alone decides who may write.

use crate::delivery::DeliveryState;
use crate::ids::{new_id, IdKind};

/// The delivery states a lease can be granted on: `pending` and `retrying` (a terminal delivery is never
/// leased). A backend's candidate query filters on exactly these.
pub const OPEN_STATES: [DeliveryState; 2] = [DeliveryState::Pending, DeliveryState::Retrying];

/// True when a delivery in `state` due at `due_at` (Unix ms; `None` = never due) can be leased at `now`
/// (store clock, Unix ms): it is open and `due_at <= now`. A leased delivery's `due_at` is its lease's
/// end ([`LeaseGrant::due_at`]), so work in flight is simply not due until its lease lapses.
pub fn is_due(state: DeliveryState, due_at: Option<i64>, now: i64) -> bool {
    OPEN_STATES.contains(&state) && due_at.is_some_and(|d| d <= now)
}

/// A new lease: the fencing token and the lease's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseGrant {
    /// Fencing token, `lse_<32 hex>`; written to the row's `lease_token`. Every delivery granted by one
    /// call may share it: a later grant on the same row always mints a new one.
    pub token: String,
    /// Lease end, Unix ms (store clock): `now + lease_ms`.
    pub until: i64,
    /// The row's new `due_at`, Unix ms: the lease's end (see [`is_due`]).
    pub due_at: i64,
}

/// Grants a lease of `lease_ms` (ms) at `now` (store clock, Unix ms) with a freshly minted token.
pub fn grant(now: i64, lease_ms: u64) -> LeaseGrant {
    grant_with(new_id(IdKind::Lease), now, lease_ms)
}

/// [`grant`] with a given token (tests; or a backend that mints tokens itself).
pub fn grant_with(token: String, now: i64, lease_ms: u64) -> LeaseGrant {
    let until = lease_end(now, lease_ms);
    LeaseGrant {
        token,
        until,
        due_at: until,
    }
}

/// `now + lease_ms` (Unix ms), saturating.
fn lease_end(now: i64, lease_ms: u64) -> i64 {
    now.saturating_add(i64::try_from(lease_ms).unwrap_or(i64::MAX))
}

/// The lease columns of one delivery row, as loaded under its row lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub state: DeliveryState,
    /// Attempts recorded so far (`deliveries.attempts`).
    pub attempts: u32,
    /// `deliveries.lease_token`: the token of the last grant, `None` once released or completed.
    pub token: Option<String>,
    /// `deliveries.lease_until`, Unix ms (store clock).
    pub until: Option<i64>,
}

/// Why a write about a lease was refused (the store answers `StoreError::LeaseLost`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLost {
    /// The delivery is already `delivered` or `dead-lettered`.
    #[error("the delivery is already {}", .0.as_str())]
    Ended(DeliveryState),
    /// The row carries another token (a later grant) or none (released, or completed by someone).
    #[error("the lease is no longer held by this token")]
    NotHeld,
    /// The lease lapsed (`lease_until <= now`); only [`renew`] refuses for this.
    #[error("the lease lapsed at {until} (now {now})")]
    Lapsed { until: i64, now: i64 },
    /// The attempt number is not the next one (`attempts + 1`): this attempt was already recorded.
    #[error("attempt {got} is not the next attempt ({expected})")]
    NotNextAttempt { expected: u32, got: u32 },
    /// The fenced `UPDATE` changed no row: another transaction won the race.
    #[error("the fenced update changed no row")]
    RaceLost,
}

fn held(row: &LeaseRow, token: &str) -> Result<(), LeaseLost> {
    if row.state.is_terminal() {
        return Err(LeaseLost::Ended(row.state));
    }
    if row.token.as_deref() != Some(token) {
        return Err(LeaseLost::NotHeld);
    }
    Ok(())
}

/// The error class of an attempt recorded `lost` ([`take_over`]).
pub const LEASE_EXPIRED: &str = "lease_expired";

/// An attempt abandoned under a lapsed lease ([`take_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned {
    /// The attempt's number, 1-based: `attempts + 1` of the row its lease was granted on.
    pub attempt: u32,
    /// When its lease lapsed, Unix ms (store clock): the row's `lease_until`.
    pub lapsed_at: i64,
}

/// Whether granting a new lease on `row` at `now` (store clock, Unix ms) takes over an abandoned
/// attempt (docs/operations.md "Lost attempts"): the delivery is open and still carries the token of
/// an earlier grant (a completion and a release both clear it), and that lease lapsed
/// (`until <= now`). Its worker never recorded an outcome (it stopped, or its commit could not reach
/// the store), yet it may have performed the action: the attempt it was granted for, number
/// `attempts + 1`, is recorded `lost` (`crate::attempt::lost`) in the transaction that writes the new
/// grant, so the new grant's attempt is `attempts + 2` and the attempt log counts every attempt a
/// target may have seen. `None` for a delivery never leased, released or completed, or whose lease
/// has not lapsed (it is not due then).
pub fn take_over(row: &LeaseRow, now: i64) -> Option<Abandoned> {
    if row.state.is_terminal() || row.token.is_none() {
        return None;
    }
    let lapsed_at = row.until.unwrap_or(now);
    (lapsed_at <= now).then_some(Abandoned {
        attempt: row.attempts.saturating_add(1),
        lapsed_at,
    })
}

/// A renewal (heartbeat): the lease's new end and the row's new `due_at` (both Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub until: i64,
    pub due_at: i64,
}

/// Renews the lease `token` holds by `lease_ms` (ms) from `now` (store clock, Unix ms); the token is
/// kept. Errors: [`LeaseLost::Ended`], [`LeaseLost::NotHeld`], or [`LeaseLost::Lapsed`] when the lease
/// already ended (`until <= now`: it may have been granted again by then, so it is not extended).
pub fn renew(row: &LeaseRow, token: &str, now: i64, lease_ms: u64) -> Result<Renewal, LeaseLost> {
    held(row, token)?;
    match row.until {
        Some(until) if until > now => {
            let until = lease_end(now, lease_ms);
            Ok(Renewal {
                until,
                due_at: until,
            })
        }
        until => Err(LeaseLost::Lapsed {
            until: until.unwrap_or(i64::MIN),
            now,
        }),
    }
}

/// Releases the lease `token` holds (the worker gives the delivery back without an attempt): the row's
/// new `due_at` is `now` (Unix ms), so it is due again at once; token and end are cleared. Errors:
/// [`LeaseLost::Ended`], [`LeaseLost::NotHeld`] (then nothing is written).
pub fn release(row: &LeaseRow, token: &str, now: i64) -> Result<i64, LeaseLost> {
    held(row, token)?;
    Ok(now)
}

/// What an attempt's commit carries to prove it still holds its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The token of the grant the attempt ran under.
    pub token: String,
    /// The attempt's number, 1-based.
    pub attempt: u32,
}

/// Accepts the completion of an attempt only if its token equals the row's, the delivery is open, and
/// the attempt is the next one (`attempts + 1`). A lapsed lease that nobody took again is still
/// accepted: the work was done, and no other worker can have done it. Errors: [`LeaseLost::Ended`],
/// [`LeaseLost::NotHeld`], [`LeaseLost::NotNextAttempt`].
pub fn accepts_completion(row: &LeaseRow, c: &Completion) -> Result<(), LeaseLost> {
    held(row, &c.token)?;
    let expected = row.attempts.saturating_add(1);
    if c.attempt != expected {
        return Err(LeaseLost::NotNextAttempt {
            expected,
            got: c.attempt,
        });
    }
    Ok(())
}

/// The fence on the write itself: a fenced `UPDATE ... WHERE id = ?1 AND lease_token = ?2` that changed
/// `rows_updated` rows. Errors: [`LeaseLost::RaceLost`] for 0.
pub fn fenced(rows_updated: u64) -> Result<(), LeaseLost> {
    if rows_updated == 0 {
        Err(LeaseLost::RaceLost)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeliveryState as D;

    fn row(state: D, token: Option<&str>, until: Option<i64>) -> LeaseRow {
        LeaseRow {
            state,
            attempts: 2,
            token: token.map(str::to_string),
            until,
        }
    }

    #[test]
    fn only_open_due_deliveries_are_leasable() {
        assert!(is_due(D::Pending, Some(1_000), 1_000));
        assert!(is_due(D::Retrying, Some(999), 1_000));
        assert!(!is_due(D::Retrying, Some(1_001), 1_000), "not yet due");
        assert!(!is_due(D::Pending, None, 1_000), "never due");
        assert!(!is_due(D::Delivered, Some(0), 1_000));
        assert!(!is_due(D::DeadLettered, Some(0), 1_000));
    }

    #[test]
    fn a_grant_mints_a_new_token_and_moves_due_to_the_lease_end() {
        let a = grant(10_000, 30_000);
        let b = grant(10_000, 30_000);
        assert!(a.token.starts_with("lse_") && a.token.len() == 4 + 32);
        assert_ne!(a.token, b.token);
        assert_eq!((a.until, a.due_at), (40_000, 40_000));
        let huge = grant_with("t".into(), i64::MAX - 5, u64::MAX);
        assert_eq!(huge.until, i64::MAX, "saturates instead of wrapping");
    }

    #[test]
    fn renewal_needs_the_token_an_open_row_and_a_live_lease() {
        let r = row(D::Retrying, Some("lse_a"), Some(40_000));
        assert_eq!(
            renew(&r, "lse_a", 39_999, 30_000),
            Ok(Renewal {
                until: 69_999,
                due_at: 69_999
            })
        );
        assert_eq!(
            renew(&r, "lse_a", 40_000, 30_000),
            Err(LeaseLost::Lapsed {
                until: 40_000,
                now: 40_000
            })
        );
        assert_eq!(renew(&r, "lse_b", 1, 30_000), Err(LeaseLost::NotHeld));
        let released = row(D::Pending, None, None);
        assert_eq!(
            renew(&released, "lse_a", 1, 30_000),
            Err(LeaseLost::NotHeld)
        );
        let done = row(D::Delivered, Some("lse_a"), Some(40_000));
        assert_eq!(
            renew(&done, "lse_a", 1, 30_000),
            Err(LeaseLost::Ended(D::Delivered))
        );
    }

    #[test]
    fn release_makes_it_due_now_for_the_holder_only() {
        let r = row(D::Pending, Some("lse_a"), Some(40_000));
        assert_eq!(release(&r, "lse_a", 12_345), Ok(12_345));
        assert_eq!(release(&r, "lse_b", 12_345), Err(LeaseLost::NotHeld));
        let dead = row(D::DeadLettered, Some("lse_a"), None);
        assert_eq!(
            release(&dead, "lse_a", 1),
            Err(LeaseLost::Ended(D::DeadLettered))
        );
    }

    #[test]
    fn a_completion_needs_the_token_and_the_next_attempt_number() {
        let r = row(D::Retrying, Some("lse_a"), Some(40_000));
        let ok = Completion {
            token: "lse_a".into(),
            attempt: 3,
        };
        assert_eq!(accepts_completion(&r, &ok), Ok(()));
        let lapsed_not_retaken = row(D::Retrying, Some("lse_a"), Some(1));
        assert_eq!(accepts_completion(&lapsed_not_retaken, &ok), Ok(()));
        let retaken = Completion {
            token: "lse_old".into(),
            ..ok.clone()
        };
        assert_eq!(accepts_completion(&r, &retaken), Err(LeaseLost::NotHeld));
        let again = Completion {
            attempt: 2,
            ..ok.clone()
        };
        assert_eq!(
            accepts_completion(&r, &again),
            Err(LeaseLost::NotNextAttempt {
                expected: 3,
                got: 2
            })
        );
        let ended = row(D::Delivered, Some("lse_a"), None);
        assert_eq!(
            accepts_completion(&ended, &ok),
            Err(LeaseLost::Ended(D::Delivered))
        );
        assert_eq!(
            LeaseLost::Ended(D::DeadLettered).to_string(),
            "the delivery is already dead-lettered"
        );
    }

    #[test]
    fn a_lapsed_grant_taken_over_is_an_abandoned_attempt() {
        // attempts = 2 recorded; the grant for attempt 3 lapsed at 40 000 with nothing recorded.
        let lapsed = row(D::Retrying, Some("lse_a"), Some(40_000));
        assert_eq!(
            take_over(&lapsed, 40_000),
            Some(Abandoned {
                attempt: 3,
                lapsed_at: 40_000
            })
        );
        assert_eq!(take_over(&lapsed, 39_999), None, "still held");
        assert_eq!(
            take_over(&row(D::Pending, None, None), 50_000),
            None,
            "never leased, released, or completed (the commit clears the token)"
        );
        assert_eq!(
            take_over(&row(D::Delivered, Some("lse_a"), Some(1)), 50_000),
            None
        );
    }

    #[test]
    fn zero_rows_updated_is_a_lost_race() {
        assert_eq!(fenced(0), Err(LeaseLost::RaceLost));
        assert_eq!(fenced(1), Ok(()));
    }
}
