//! Receipt lifecycle (DESIGN §4 Receipt; signals-and-connectors §6).

use serde::{Deserialize, Serialize};

/// Where a receipt came from, stored as `receipts.source`: the edge that handed the inbound work to the
/// engine's one entry (`tb_engine::accept`).
///
/// The subscription [`crate::subscription::Source`] (OpenWOP's `webhook | schedule | queue | form`) is
/// a subset: a capability URL and an API run are no subscription's source, so this enum extends it
/// ([`ReceiptSource::from`] maps one onto the other).
///
/// - `webhook`: a provider's signed HTTP post to `POST /v1/webhooks/{subscription}` (also its refusal
///   records: `rejected`, `rate_limited`).
/// - `capability`: a post to a minted capability URL `POST /v1/hooks/{token}`.
/// - `api`: a run requested through `POST /v1/runs`.
/// - `schedule`: a cron firing of a schedule subscription.
/// - `queue`: a message taken from a queue (a NATS JetStream consumer).
/// - `form`: a form submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptSource {
    Webhook,
    Capability,
    Api,
    Schedule,
    Queue,
    Form,
}

impl ReceiptSource {
    /// Every source, in declaration order.
    pub const ALL: [ReceiptSource; 6] = [
        ReceiptSource::Webhook,
        ReceiptSource::Capability,
        ReceiptSource::Api,
        ReceiptSource::Schedule,
        ReceiptSource::Queue,
        ReceiptSource::Form,
    ];

    /// Stored string (`webhook`, `capability`, `api`, `schedule`, `queue`, `form`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptSource::Webhook => "webhook",
            ReceiptSource::Capability => "capability",
            ReceiptSource::Api => "api",
            ReceiptSource::Schedule => "schedule",
            ReceiptSource::Queue => "queue",
            ReceiptSource::Form => "form",
        }
    }

    /// Parses the stored string; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl From<crate::subscription::Source> for ReceiptSource {
    fn from(s: crate::subscription::Source) -> Self {
        use crate::subscription::Source;
        match s {
            Source::Webhook => ReceiptSource::Webhook,
            Source::Schedule => ReceiptSource::Schedule,
            Source::Queue => ReceiptSource::Queue,
            Source::Form => ReceiptSource::Form,
        }
    }
}

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

    /// The states a stored receipt can be in (what `receipts list --state` and `GET /v1/receipts?state=`
    /// accept): a receipt is committed `routed` or terminal, so `received`, `authenticated`,
    /// `normalized`, `matched` and `duplicate` appear only as timeline entries, never as its state.
    pub const STORED: &'static [ReceiptState] = &[
        ReceiptState::Routed,
        ReceiptState::Queued,
        ReceiptState::Consumed,
        ReceiptState::Rejected,
        ReceiptState::Unmatched,
        ReceiptState::RateLimited,
        ReceiptState::Disabled,
        ReceiptState::Expired,
        ReceiptState::TargetTerminal,
        ReceiptState::RoutingFailed,
        ReceiptState::DeadLettered,
    ];

    /// Parses the wire string of a state in [`ReceiptState::STORED`]; `None` for timeline-only or
    /// unknown words.
    pub fn parse_stored(s: &str) -> Option<Self> {
        Self::STORED.iter().copied().find(|st| st.as_str() == s)
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

/// One delivery as receipt settlement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryView<'a> {
    pub state: crate::delivery::DeliveryState,
    /// Dead-letter reason, when dead-lettered.
    pub reason: Option<&'a str>,
    /// Its effect was consumed: the run started, or the signal / prompt it queued was taken by a wait or
    /// an acknowledged turn.
    pub consumed: bool,
}

/// Dead-letter reasons that mean the target run had ended.
pub const TARGET_TERMINAL_REASONS: &[&str] = &["target_terminal"];
/// Dead-letter reasons that mean the binding was revoked before its delivery acted.
pub const DISABLED_REASONS: &[&str] = &["binding_revoked"];
/// Dead-letter reasons that mean routing could not be done (non-retryable).
pub const ROUTING_FAILED_REASONS: &[&str] = &[
    "template_field_missing",
    "invalid_signal_name",
    "target_missing",
    "workflow_missing",
];

/// True for attempt error classes that come from routing policy or the target session rather than a
/// failing delivery: a revoked binding, an ended or missing target, a template that cannot be rendered,
/// a full mailbox. They settle the receipt (`disabled`, `target_terminal`, `routing_failed`, or retry)
/// but never count against the subscription's breaker or dead-letter state (DESIGN §4 Subscription
/// counts delivery failures only).
pub fn is_policy_refusal(error_class: Option<&str>) -> bool {
    error_class.is_some_and(|r| {
        DISABLED_REASONS.contains(&r)
            || TARGET_TERMINAL_REASONS.contains(&r)
            || ROUTING_FAILED_REASONS.contains(&r)
            || r == "signal_buffer_full"
            || r == "target_starting"
    })
}

/// The state a receipt settles in once all its deliveries are terminal (signals-and-connectors §6):
/// `dead_lettered` if any delivery exhausted its retries, else `routing_failed` if any could not be
/// routed, else `disabled` if its binding was revoked, else `target_terminal` if any target had ended, else `consumed` when every effect was
/// consumed, else `queued` (delivered to the target's queue, not yet consumed). `None` while any delivery
/// is still open.
pub fn settle(deliveries: &[DeliveryView<'_>]) -> Option<ReceiptState> {
    use crate::delivery::DeliveryState as D;
    if deliveries.iter().any(|d| !d.state.is_terminal()) {
        return None;
    }
    let dead = |set: Option<&[&str]>| {
        deliveries.iter().any(|d| {
            d.state == D::DeadLettered
                && match set {
                    Some(set) => d.reason.is_some_and(|r| set.contains(&r)),
                    None => !d.reason.is_some_and(|r| {
                        ROUTING_FAILED_REASONS.contains(&r)
                            || TARGET_TERMINAL_REASONS.contains(&r)
                            || DISABLED_REASONS.contains(&r)
                    }),
                }
        })
    };
    Some(if dead(None) {
        ReceiptState::DeadLettered
    } else if dead(Some(ROUTING_FAILED_REASONS)) {
        ReceiptState::RoutingFailed
    } else if dead(Some(DISABLED_REASONS)) {
        ReceiptState::Disabled
    } else if dead(Some(TARGET_TERMINAL_REASONS)) {
        ReceiptState::TargetTerminal
    } else if deliveries.iter().all(|d| d.consumed) {
        ReceiptState::Consumed
    } else {
        ReceiptState::Queued
    })
}

/// What a receipt's state becomes after one of its deliveries changed: [`settle`] over `deliveries`
/// (every delivery of the receipt, the changed one with its new state), written over `current` (the
/// receipt's stored state). `None` means write nothing: a delivery is still open, the receipt already
/// reads the settled state, or it is `expired` (retention's word is final; nothing overwrites it).
///
/// A backend loads this under the receipt row's lock (`SELECT state FROM receipts WHERE id = ?1 FOR
/// UPDATE`, taken after the delivery row's lock) and reads the deliveries in a later statement, so two
/// deliveries of one receipt ending at once on two replicas cannot both see the other still open.
pub fn settled_state(
    current: ReceiptState,
    deliveries: &[DeliveryView<'_>],
) -> Option<ReceiptState> {
    if current == ReceiptState::Expired {
        return None;
    }
    settle(deliveries).filter(|s| *s != current)
}

#[cfg(test)]
mod tests {
    #[test]
    fn settled_state_writes_only_a_change_and_never_over_expired() {
        use super::{settled_state, DeliveryView, ReceiptState as R};
        use crate::delivery::DeliveryState as D;
        let done = DeliveryView {
            state: D::Delivered,
            reason: None,
            consumed: true,
        };
        let open = DeliveryView {
            state: D::Retrying,
            ..done
        };
        assert_eq!(settled_state(R::Routed, &[done, done]), Some(R::Consumed));
        assert_eq!(settled_state(R::Routed, &[done, open]), None, "still open");
        assert_eq!(settled_state(R::Consumed, &[done]), None, "unchanged");
        assert_eq!(settled_state(R::Expired, &[done]), None, "expired stays");
        let queued = DeliveryView {
            consumed: false,
            ..done
        };
        assert_eq!(settled_state(R::Queued, &[done, queued]), None);
        assert_eq!(settled_state(R::Routed, &[done, queued]), Some(R::Queued));
    }

    #[test]
    fn only_stored_states_parse_as_a_filter() {
        use super::ReceiptState;
        assert_eq!(
            ReceiptState::parse_stored("queued"),
            Some(ReceiptState::Queued)
        );
        assert_eq!(
            ReceiptState::parse_stored("dead_lettered"),
            Some(ReceiptState::DeadLettered)
        );
        for timeline_only in [
            "received",
            "authenticated",
            "normalized",
            "matched",
            "duplicate",
            "nope",
        ] {
            assert_eq!(
                ReceiptState::parse_stored(timeline_only),
                None,
                "{timeline_only}"
            );
        }
    }

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

    fn v(state: D, reason: Option<&str>, consumed: bool) -> DeliveryView<'_> {
        DeliveryView {
            state,
            reason,
            consumed,
        }
    }

    #[test]
    fn settles_when_all_deliveries_are_terminal() {
        assert_eq!(
            settle(&[v(D::Delivered, None, true), v(D::Retrying, None, false)]),
            None
        );
        assert_eq!(
            settle(&[v(D::Delivered, None, true), v(D::Delivered, None, true)]),
            Some(ReceiptState::Consumed)
        );
        assert_eq!(
            settle(&[v(D::Delivered, None, true), v(D::Delivered, None, false)]),
            Some(ReceiptState::Queued)
        );
        assert_eq!(
            settle(&[
                v(D::Delivered, None, true),
                v(D::DeadLettered, Some("retries_exhausted"), false)
            ]),
            Some(ReceiptState::DeadLettered)
        );
        assert_eq!(
            settle(&[v(D::DeadLettered, Some("target_terminal"), false)]),
            Some(ReceiptState::TargetTerminal)
        );
        assert_eq!(
            settle(&[v(D::DeadLettered, Some("binding_revoked"), false)]),
            Some(ReceiptState::Disabled)
        );
        assert_eq!(
            settle(&[
                v(D::DeadLettered, Some("target_terminal"), false),
                v(D::DeadLettered, Some("target_missing"), false)
            ]),
            Some(ReceiptState::RoutingFailed)
        );
    }
    #[test]
    fn receipt_sources_round_trip_and_extend_subscription_sources() {
        for s in ReceiptSource::ALL {
            assert_eq!(ReceiptSource::parse(s.as_str()), Some(s));
        }
        assert_eq!(ReceiptSource::parse("cron"), None);
        assert_eq!(
            ReceiptSource::from(crate::subscription::Source::Schedule).as_str(),
            "schedule"
        );
    }
}
