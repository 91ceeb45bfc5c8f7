//! A delivery created dead-lettered (its subscription is dead-lettered, or verification failed): it is
//! recorded as attempt 1 so it reads like any other dead letter (RFC 0232) and a replay continues at
//! attempt 2.

use super::{AttemptRow, SubscriptionEvent};
use crate::delivery::AttemptOutcome;
use crate::events::{self, DeliveryAttempted};
use crate::ids::{new_id, IdKind};

/// Error class recorded when a delivery created dead-lettered names no reason.
pub const SUBSCRIPTION_DEAD_LETTERED: &str = "subscription_dead_lettered";

/// What ingest writes for one delivery it creates dead-lettered, in the receipt's transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestDeadLetter {
    /// Attempt 1, outcome `dead-lettered`, error class = the reason, duration 0, never due.
    pub attempt: AttemptRow,
    /// The delivery's `attempts = 1` and `first_attempt_at` (Unix ms: the receipt's arrival).
    pub first_attempt_at: i64,
    /// Its `trigger.delivery.attempted` (no `runId`).
    pub event: SubscriptionEvent,
}

/// The record of delivery `delivery_id` (of `subscription_id`, dedup key `dedup_key`) created
/// dead-lettered for `reason` (default [`SUBSCRIPTION_DEAD_LETTERED`]) by a receipt that arrived at
/// `received_at` (Unix ms).
pub fn dead_lettered_at_ingest(
    delivery_id: &str,
    subscription_id: &str,
    dedup_key: &str,
    reason: Option<&str>,
    received_at: i64,
) -> IngestDeadLetter {
    let event_id = new_id(IdKind::Event);
    let payload = serde_json::to_value(DeliveryAttempted {
        subscription_id: subscription_id.to_string(),
        dedup_key: dedup_key.to_string(),
        attempt: 1,
        outcome: AttemptOutcome::DeadLettered,
        run_id: None,
    })
    .expect("serializable");
    IngestDeadLetter {
        attempt: AttemptRow {
            delivery_id: delivery_id.to_string(),
            attempt: 1,
            event_id: event_id.clone(),
            outcome: AttemptOutcome::DeadLettered,
            error_class: Some(reason.unwrap_or(SUBSCRIPTION_DEAD_LETTERED).to_string()),
            message: None,
            started_at: received_at,
            duration_ms: 0,
            next_due_at: None,
        },
        first_attempt_at: received_at,
        event: SubscriptionEvent {
            event_id,
            subscription_id: subscription_id.to_string(),
            event_type: events::DELIVERY_ATTEMPTED,
            payload,
            delivery_id: Some(delivery_id.to_string()),
            timestamp: received_at,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_delivery_dead_lettered_at_ingest_reads_as_attempt_one() {
        let r = dead_lettered_at_ingest("dlv_1", "github", "dk_1", None, 5_000);
        assert_eq!(
            r.attempt,
            AttemptRow {
                delivery_id: "dlv_1".into(),
                attempt: 1,
                event_id: r.event.event_id.clone(),
                outcome: AttemptOutcome::DeadLettered,
                error_class: Some("subscription_dead_lettered".into()),
                message: None,
                started_at: 5_000,
                duration_ms: 0,
                next_due_at: None,
            }
        );
        assert!(r.event.event_id.starts_with("evt_"));
        assert_eq!(r.first_attempt_at, 5_000);
        assert_eq!(
            (
                r.event.event_type,
                r.event.delivery_id.as_deref(),
                r.event.timestamp
            ),
            ("trigger.delivery.attempted", Some("dlv_1"), 5_000)
        );
        assert_eq!(
            r.event.payload,
            json!({"subscriptionId": "github", "dedupKey": "dk_1", "attempt": 1, "outcome": "dead-lettered"})
        );
        let v = dead_lettered_at_ingest("dlv_2", "github", "dk_2", Some("verification_failed"), 1);
        assert_eq!(
            v.attempt.error_class.as_deref(),
            Some("verification_failed")
        );
    }
}
