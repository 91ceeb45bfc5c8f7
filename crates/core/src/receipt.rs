//! Receipt lifecycle (DESIGN §4 Receipt; signals-and-connectors §6).

use serde::{Deserialize, Serialize};

/// Receipt state: progress `received -> authenticated -> normalized -> matched -> routed -> queued ->
/// consumed`, or one terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptState {
    Received,
    Authenticated,
    Normalized,
    Matched,
    Routed,
    Queued,
    Consumed,
    Rejected,
    Duplicate,
    Unmatched,
    RateLimited,
    Disabled,
    Expired,
    TargetTerminal,
    RoutingFailed,
    DeadLettered,
}

impl ReceiptState {
    /// Wire string (`queued`, `dead_lettered`, ...).
    pub fn as_str(self) -> &'static str {
        use ReceiptState::*;
        match self {
            Received => "received",
            Authenticated => "authenticated",
            Normalized => "normalized",
            Matched => "matched",
            Routed => "routed",
            Queued => "queued",
            Consumed => "consumed",
            Rejected => "rejected",
            Duplicate => "duplicate",
            Unmatched => "unmatched",
            RateLimited => "rate_limited",
            Disabled => "disabled",
            Expired => "expired",
            TargetTerminal => "target_terminal",
            RoutingFailed => "routing_failed",
            DeadLettered => "dead_lettered",
        }
    }

    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        use ReceiptState::*;
        [
            Received,
            Authenticated,
            Normalized,
            Matched,
            Routed,
            Queued,
            Consumed,
            Rejected,
            Duplicate,
            Unmatched,
            RateLimited,
            Disabled,
            Expired,
            TargetTerminal,
            RoutingFailed,
            DeadLettered,
        ]
        .into_iter()
        .find(|s2| s2.as_str() == s)
    }

    /// True for `consumed` and every terminal alternative.
    pub fn is_final(self) -> bool {
        use ReceiptState::*;
        !matches!(
            self,
            Received | Authenticated | Normalized | Matched | Routed | Queued
        )
    }
}

/// The state a receipt settles in once all its deliveries are terminal: `dead_lettered` if any delivery
/// was dead-lettered, else `consumed` (every delivery took effect). `None` while any is still open.
pub fn settle(delivery_states: &[crate::delivery::DeliveryState]) -> Option<ReceiptState> {
    use crate::delivery::DeliveryState as D;
    if delivery_states.iter().any(|s| !s.is_terminal()) {
        return None;
    }
    if delivery_states.contains(&D::DeadLettered) {
        Some(ReceiptState::DeadLettered)
    } else {
        Some(ReceiptState::Consumed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::DeliveryState as D;

    #[test]
    fn strings_round_trip_and_finality() {
        for s in [
            "received",
            "queued",
            "consumed",
            "dead_lettered",
            "target_terminal",
            "unmatched",
        ] {
            assert_eq!(ReceiptState::parse(s).unwrap().as_str(), s);
        }
        assert!(!ReceiptState::Queued.is_final());
        assert!(ReceiptState::Unmatched.is_final());
        assert_eq!(ReceiptState::parse("nope"), None);
    }

    #[test]
    fn settles_when_all_deliveries_are_terminal() {
        assert_eq!(settle(&[D::Delivered, D::Retrying]), None);
        assert_eq!(
            settle(&[D::Delivered, D::Delivered]),
            Some(ReceiptState::Consumed)
        );
        assert_eq!(
            settle(&[D::Delivered, D::DeadLettered]),
            Some(ReceiptState::DeadLettered)
        );
    }
}
