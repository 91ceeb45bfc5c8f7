//! What an attempt abandoned under a lapsed lease writes when its delivery is leased again
//! (`crate::lease::take_over`; docs/operations.md "Lost attempts").

use super::AttemptRow;
use crate::delivery::AttemptOutcome;
use crate::lease::{Abandoned, LEASE_EXPIRED};

/// The message a `lost` attempt is recorded with (content-free).
pub const LOST_MESSAGE: &str = "the lease lapsed with no outcome recorded (the worker stopped or \
could not reach the store); the action may have taken effect";

/// The writes of one lost attempt, in the transaction that grants the new lease: insert `attempt`,
/// then `UPDATE deliveries SET attempts, first_attempt_at, last_error, updated_at` (state, due time
/// and run untouched; the grant that follows sets the lease columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWrites {
    /// The `attempts` row: outcome `lost`, error class `lease_expired`, started at the lease's lapse
    /// (the real start is not known), duration 0, no next due time.
    pub attempt: AttemptRow,
    /// `deliveries.attempts` after it: the abandoned attempt's number.
    pub attempts: u32,
    /// `deliveries.first_attempt_at`: the stored one, else the lapse.
    pub first_attempt_at: i64,
    /// `deliveries.last_error`: `lease_expired`.
    pub last_error: &'static str,
    /// `deliveries.updated_at`, Unix ms.
    pub updated_at: i64,
}

/// The record of abandoned attempt `a` of delivery `delivery_id` (its stored `first_attempt_at`),
/// taken over at `now` (store clock, Unix ms). `event_id` (`evt_<32 hex>`) fills the attempt row's
/// event id: a lost attempt is announced by no `trigger.delivery.attempted` event (its outcome is not
/// one of the event's), so the id names nothing else. The subscription's failure streak and the
/// receipt are not touched: the delivery is about to be attempted again.
pub fn lost(
    delivery_id: &str,
    first_attempt_at: Option<i64>,
    a: &Abandoned,
    event_id: String,
    now: i64,
) -> LostWrites {
    LostWrites {
        attempt: AttemptRow {
            delivery_id: delivery_id.to_string(),
            attempt: a.attempt,
            event_id,
            outcome: AttemptOutcome::Lost,
            error_class: Some(LEASE_EXPIRED.to_string()),
            message: Some(LOST_MESSAGE.to_string()),
            started_at: a.lapsed_at,
            duration_ms: 0,
            next_due_at: None,
        },
        attempts: a.attempt,
        first_attempt_at: first_attempt_at.unwrap_or(a.lapsed_at),
        last_error: LEASE_EXPIRED,
        updated_at: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::DeliveryState;
    use crate::lease::{take_over, LeaseRow};

    #[test]
    fn a_taken_over_lease_records_its_attempt_lost_and_moves_the_count_on() {
        // Attempt 1's commit never reached the store; its lease lapsed at 61 000.
        let row = LeaseRow {
            state: DeliveryState::Pending,
            attempts: 0,
            token: Some("lse_a".into()),
            until: Some(61_000),
        };
        let a = take_over(&row, 61_500).unwrap();
        let w = lost("dlv_1", None, &a, "evt_1".into(), 61_500);
        assert_eq!(
            w.attempt,
            AttemptRow {
                delivery_id: "dlv_1".into(),
                attempt: 1,
                event_id: "evt_1".into(),
                outcome: AttemptOutcome::Lost,
                error_class: Some("lease_expired".into()),
                message: Some(LOST_MESSAGE.into()),
                started_at: 61_000,
                duration_ms: 0,
                next_due_at: None,
            }
        );
        assert_eq!(
            (w.attempts, w.first_attempt_at, w.last_error, w.updated_at),
            (1, 61_000, "lease_expired", 61_500)
        );
        assert_eq!(w.attempt.outcome.as_str(), "lost");
        // A delivery attempted before keeps its first attempt's time.
        let again = lost("dlv_1", Some(1_000), &a, "evt_2".into(), 61_500);
        assert_eq!(again.first_attempt_at, 1_000);
    }
}
