//! Retention rules (DESIGN §7; RFC 0232 purge): which raw bodies and dead letters a sweep may delete.
//! The store walks its rows in key order and asks these functions about each one; it decides nothing.

use crate::delivery::DeliveryState;
use crate::receipt::ReceiptState;

/// Whether a receipt's raw body may be deleted: the receipt is settled ([`ReceiptState::is_final`]:
/// `consumed` or a terminal state) and was received (ms since the epoch) before `before` (ms; now minus
/// the body retention). A receipt still in progress (`routed`, `queued`, ...) keeps its body whatever
/// its age, because a replay or redelivery may need it.
pub fn body_expired(state: ReceiptState, received_at_ms: i64, before_ms: i64) -> bool {
    state.is_final() && received_at_ms < before_ms
}

/// Whether a body walk in receipt-id order may end at a body received at `received_at_ms`: it is not
/// yet past the retention (`received_at_ms >= before_ms`). Receipt ids are UUIDv7 minted at ingest, so id
/// order is arrival order and every later body is younger too; a pass thus costs the old bodies, not the
/// whole table. A body out of that order (clock step) is only swept by a later pass, never kept forever.
pub fn body_walk_ends(received_at_ms: i64, before_ms: i64) -> bool {
    received_at_ms >= before_ms
}

/// Whether a delivery is a dead letter past its retention: `dead-lettered`, and last updated (ms; the
/// time it was dead-lettered) before `before` (ms; now minus the dead-letter retention).
pub fn dead_letter_expired(state: DeliveryState, updated_at_ms: i64, before_ms: i64) -> bool {
    state == DeliveryState::DeadLettered && updated_at_ms < before_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_settled_old_bodies_expire() {
        assert!(body_expired(ReceiptState::Unmatched, 10, 11));
        assert!(body_expired(ReceiptState::Consumed, 10, 11));
        assert!(
            !body_expired(ReceiptState::Unmatched, 11, 11),
            "strictly before"
        );
        assert!(!body_expired(ReceiptState::Routed, 0, 11));
        assert!(!body_expired(ReceiptState::Queued, 0, 11));
    }

    #[test]
    fn a_body_walk_ends_at_the_first_young_body() {
        assert!(body_walk_ends(11, 11));
        assert!(!body_walk_ends(10, 11));
    }

    #[test]
    fn only_old_dead_letters_expire() {
        assert!(dead_letter_expired(DeliveryState::DeadLettered, 10, 11));
        assert!(!dead_letter_expired(DeliveryState::DeadLettered, 11, 11));
        assert!(!dead_letter_expired(DeliveryState::Pending, 0, 11));
        assert!(!dead_letter_expired(DeliveryState::Delivered, 0, 11));
    }
}
