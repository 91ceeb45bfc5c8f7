//! Trigger subscriptions and their state machine (DESIGN §4 Subscription; OpenWOP trigger-bridge §2, §3).
//!
//! The transition function [`transition`] is the ONE place the subscription rules live; the store and the
//! engine call it and persist what it returns.

use serde::{Deserialize, Serialize};

/// Kind of inbound work (OpenWOP `TriggerSubscription.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Webhook,
    Schedule,
    Queue,
    Form,
}

impl Source {
    /// Wire string (`webhook`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Webhook => "webhook",
            Source::Schedule => "schedule",
            Source::Queue => "queue",
            Source::Form => "form",
        }
    }
}

/// Subscription state (OpenWOP: `active, paused, failed, dead-lettered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubscriptionState {
    Active,
    Paused,
    Failed,
    DeadLettered,
}

impl SubscriptionState {
    /// Wire string (`active`, `paused`, `failed`, `dead-lettered`).
    pub fn as_str(self) -> &'static str {
        match self {
            SubscriptionState::Active => "active",
            SubscriptionState::Paused => "paused",
            SubscriptionState::Failed => "failed",
            SubscriptionState::DeadLettered => "dead-lettered",
        }
    }

    /// Whether the subscription waits for an operator (`failed`: its breaker tripped; `dead-lettered`:
    /// a delivery exhausted its retries). `GET /ready` lists these as warnings, never as a readiness
    /// failure: the process is serving, and resuming them is an operator decision (OpenWOP states).
    pub fn needs_operator(self) -> bool {
        matches!(
            self,
            SubscriptionState::Failed | SubscriptionState::DeadLettered
        )
    }

    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => SubscriptionState::Active,
            "paused" => SubscriptionState::Paused,
            "failed" => SubscriptionState::Failed,
            "dead-lettered" => SubscriptionState::DeadLettered,
            _ => return None,
        })
    }
}

/// Closed reasons of `trigger.subscription.state.changed` (OpenWOP trigger-bridge §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StateChangeReason {
    RetryExhausted,
    OperatorPaused,
    SignatureInvalid,
    Backpressure,
    SourceRemoved,
    ProvenanceUnevaluable,
}

/// What happened to a subscription, as input to [`transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionInput {
    /// An operator paused it.
    OperatorPause,
    /// An operator resumed it (from paused, failed or dead-lettered).
    OperatorResume,
    /// A delivery attempt failed; `consecutive_failures` counts this one, `threshold` is the
    /// subscription's circuit-breaker threshold.
    AttemptFailed {
        consecutive_failures: u32,
        threshold: u32,
    },
    /// A delivery attempt succeeded.
    AttemptDelivered,
    /// A delivery exhausted its retries. `continuous_failure` is true when no delivery of the subscription
    /// has succeeded since that delivery's first attempt.
    DeliveryExhausted { continuous_failure: bool },
}

/// A state change to persist and announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: SubscriptionState,
    pub to: SubscriptionState,
    /// `None` where no value of the closed reason enum fits (the field is optional on the wire):
    /// breaker trips and recoveries.
    pub reason: Option<StateChangeReason>,
}

/// The subscription state machine. Returns `None` when the input changes nothing.
///
/// * `active -> paused` / `failed -> paused` / `dead-lettered -> paused` on pause (`operator-paused`);
///   `paused|failed|dead-lettered -> active` on resume.
/// * `active -> failed` when consecutive failed attempts reach the threshold; `failed -> active` on a
///   successful attempt.
/// * `active|failed -> dead-lettered` when a delivery is exhausted under continuous failure
///   (`retry-exhausted`); only an operator resume leaves `dead-lettered`.
/// * A paused subscription ignores attempt outcomes. Refused requests (bad signature, stale timestamp,
///   malformed) are never inputs: they never change state.
pub fn transition(state: SubscriptionState, input: SubscriptionInput) -> Option<Transition> {
    use SubscriptionInput as I;
    use SubscriptionState as S;
    let (to, reason) = match (state, input) {
        (S::Paused, I::OperatorPause) => return None,
        (_, I::OperatorPause) => (S::Paused, Some(StateChangeReason::OperatorPaused)),
        (S::Active, I::OperatorResume) => return None,
        // The closed reason enum has no "resumed": an operator's hold and its release both carry
        // `operator-paused` (issue #4: pause and resume emit state.changed with operator-paused).
        (_, I::OperatorResume) => (S::Active, Some(StateChangeReason::OperatorPaused)),
        (
            S::Active,
            I::AttemptFailed {
                consecutive_failures,
                threshold,
            },
        ) if threshold > 0 && consecutive_failures >= threshold => (S::Failed, None),
        (S::Failed, I::AttemptDelivered) => (S::Active, None),
        (
            S::Active | S::Failed,
            I::DeliveryExhausted {
                continuous_failure: true,
            },
        ) => (S::DeadLettered, Some(StateChangeReason::RetryExhausted)),
        _ => return None,
    };
    Some(Transition {
        from: state,
        to,
        reason,
    })
}

/// How ingest treats a new request for a subscription in `state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Commit the receipt and route it.
    Accept,
    /// Commit the receipt, but its deliveries go straight to the dead-letter store (DESIGN §4).
    AcceptAsDeadLetter,
    /// Refuse with 409 `subscription_not_active`; nothing is committed.
    Refuse,
}

/// Admission rule per state (DESIGN §4): paused refuses; dead-lettered keeps receipts as dead letters.
pub fn admission(state: SubscriptionState) -> Admission {
    match state {
        SubscriptionState::Active | SubscriptionState::Failed => Admission::Accept,
        SubscriptionState::DeadLettered => Admission::AcceptAsDeadLetter,
        SubscriptionState::Paused => Admission::Refuse,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SubscriptionInput as I;
    use SubscriptionState as S;

    fn to(s: S, i: I) -> Option<S> {
        transition(s, i).map(|t| t.to)
    }

    #[test]
    fn operator_pause_and_resume() {
        let t = transition(S::Active, I::OperatorPause).unwrap();
        assert_eq!(
            (t.from, t.to, t.reason),
            (
                S::Active,
                S::Paused,
                Some(StateChangeReason::OperatorPaused)
            )
        );
        assert_eq!(to(S::Paused, I::OperatorPause), None);
        assert_eq!(to(S::Paused, I::OperatorResume), Some(S::Active));
        let r = transition(S::Paused, I::OperatorResume).unwrap();
        assert_eq!(r.reason, Some(StateChangeReason::OperatorPaused));
        assert_eq!(to(S::DeadLettered, I::OperatorResume), Some(S::Active));
        assert_eq!(to(S::Active, I::OperatorResume), None);
    }

    #[test]
    fn breaker_trips_and_recovers() {
        let f = |n| I::AttemptFailed {
            consecutive_failures: n,
            threshold: 3,
        };
        assert_eq!(to(S::Active, f(2)), None);
        assert_eq!(to(S::Active, f(3)), Some(S::Failed));
        assert_eq!(to(S::Failed, f(4)), None);
        assert_eq!(to(S::Failed, I::AttemptDelivered), Some(S::Active));
        assert_eq!(to(S::Active, I::AttemptDelivered), None);
        assert_eq!(
            to(
                S::Active,
                I::AttemptFailed {
                    consecutive_failures: 99,
                    threshold: 0
                }
            ),
            None,
            "0 disables"
        );
    }

    #[test]
    fn exhaustion_dead_letters_only_under_continuous_failure() {
        let t = transition(
            S::Failed,
            I::DeliveryExhausted {
                continuous_failure: true,
            },
        )
        .unwrap();
        assert_eq!(
            (t.to, t.reason),
            (S::DeadLettered, Some(StateChangeReason::RetryExhausted))
        );
        assert_eq!(
            to(
                S::Active,
                I::DeliveryExhausted {
                    continuous_failure: false
                }
            ),
            None
        );
        assert_eq!(
            to(
                S::Paused,
                I::DeliveryExhausted {
                    continuous_failure: true
                }
            ),
            None
        );
        assert_eq!(
            to(S::DeadLettered, I::AttemptDelivered),
            None,
            "only an operator resumes"
        );
    }

    #[test]
    fn admission_per_state() {
        assert_eq!(admission(S::Active), Admission::Accept);
        assert_eq!(admission(S::Failed), Admission::Accept);
        assert_eq!(admission(S::DeadLettered), Admission::AcceptAsDeadLetter);
        assert_eq!(admission(S::Paused), Admission::Refuse);
    }

    #[test]
    fn state_strings_round_trip() {
        for s in [S::Active, S::Paused, S::Failed, S::DeadLettered] {
            assert_eq!(S::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
        }
    }
}
