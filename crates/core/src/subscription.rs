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

/// How a subscription judges failure (DESIGN §4 Subscription). "Continuous failure"
/// means continuous: a streak of failed attempts with no success in between, long enough in time AND in
/// count. Svix disables an endpoint only after it failed continuously for days; the defaults follow.
///
/// Config: `[server]` / `[[subscriptions]]` keys `failure_window_ms`, `dead_letter_after_ms`,
/// `dead_letter_min_failures` (the breaker threshold stays `failure_threshold`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// The breaker (`active -> failed`) also needs the failure streak to have lasted this long, in ms:
    /// no success for this window. Default [`DEFAULT_FAILURE_WINDOW_MS`] (60 000 = 1 min), so a stream
    /// that fails 50 % at random never trips it.
    pub failure_window_ms: u64,
    /// A delivery exhausted while the streak has lasted at least this long, in ms, dead-letters the
    /// subscription. Default [`DEFAULT_DEAD_LETTER_AFTER_MS`] (432 000 000 = 5 days, as Svix).
    pub dead_letter_after_ms: u64,
    /// ... and only when the streak holds at least this many failed attempts. Default
    /// [`DEFAULT_DEAD_LETTER_MIN_FAILURES`] (10); must be at least 1.
    pub dead_letter_min_failures: u32,
}

/// Default breaker window: 1 min, in ms.
pub const DEFAULT_FAILURE_WINDOW_MS: u64 = 60_000;
/// Default continuous-failure span before a subscription is dead-lettered: 5 days, in ms.
pub const DEFAULT_DEAD_LETTER_AFTER_MS: u64 = 5 * 86_400_000;
/// Default least number of failed attempts in that span.
pub const DEFAULT_DEAD_LETTER_MIN_FAILURES: u32 = 10;

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy {
            failure_window_ms: DEFAULT_FAILURE_WINDOW_MS,
            dead_letter_after_ms: DEFAULT_DEAD_LETTER_AFTER_MS,
            dead_letter_min_failures: DEFAULT_DEAD_LETTER_MIN_FAILURES,
        }
    }
}

impl FailurePolicy {
    /// Checks the values. Errors: a sentence naming the key to fix (`dead_letter_min_failures` must be
    /// at least 1).
    pub fn validate(&self) -> Result<(), String> {
        if self.dead_letter_min_failures == 0 {
            return Err("dead_letter_min_failures must be at least 1 (default 10)".into());
        }
        Ok(())
    }
}

/// The subscription's current failure streak, as the store keeps it: failed attempts since the last
/// success. Times are Unix ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureStreak {
    /// Last delivered attempt of the subscription, if any.
    pub last_success_at: Option<i64>,
    /// Failed attempts since then, counting the one being judged.
    pub failures_since: u32,
    /// Start of the first of those failed attempts.
    pub first_failure_at: i64,
    /// Time of the attempt being judged.
    pub now: i64,
}

impl FailureStreak {
    /// How long the streak has lasted, in ms (0 if the clock went back).
    pub fn span_ms(&self) -> u64 {
        self.now.saturating_sub(self.first_failure_at).max(0) as u64
    }

    /// The streak after one more failed attempt starting at `now`: a fresh streak when it is the first
    /// failure since the last success (`failures_before == 0`).
    pub fn next(
        last_success_at: Option<i64>,
        failures_before: u32,
        first_failure_at: Option<i64>,
        now: i64,
    ) -> FailureStreak {
        let first = match (failures_before, first_failure_at) {
            (0, _) | (_, None) => now,
            (_, Some(t)) => t,
        };
        FailureStreak {
            last_success_at,
            failures_since: failures_before.saturating_add(1),
            first_failure_at: first,
            now,
        }
    }
}

/// How fresh `last_success_at` is kept, in ms: a success refreshes it only when the stored value is at
/// least this old. It is shown to operators and never judged by a rule, and this keeps a busy
/// subscription's row from being rewritten (and, on PostgreSQL, locked) by every attempt.
pub const LAST_SUCCESS_RESOLUTION_MS: i64 = 1_000;

/// After a delivered attempt: whether the subscription row must be written. It must when a failure
/// streak is to be reset (`consecutive_failures > 0` or a `first_failure_at`), or when `last_success_at`
/// is unset or at least [`LAST_SUCCESS_RESOLUTION_MS`] older than `now` (ms).
pub fn success_needs_write(
    last_success_at: Option<i64>,
    consecutive_failures: u32,
    first_failure_at: Option<i64>,
    now: i64,
) -> bool {
    consecutive_failures > 0
        || first_failure_at.is_some()
        || last_success_at.is_none_or(|t| now.saturating_sub(t) >= LAST_SUCCESS_RESOLUTION_MS)
}

/// What happened to a subscription, as input to [`transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionInput {
    /// An operator paused it.
    OperatorPause,
    /// An operator resumed it (from paused, failed or dead-lettered).
    OperatorResume,
    /// A delivery attempt failed. `streak` counts this one; `threshold` is the subscription's
    /// circuit-breaker threshold (consecutive failures; 0 never trips).
    AttemptFailed {
        streak: FailureStreak,
        threshold: u32,
        policy: FailurePolicy,
    },
    /// A delivery attempt succeeded.
    AttemptDelivered,
    /// A delivery exhausted its retries; `streak` is the subscription's failure streak including the
    /// exhausting attempt.
    DeliveryExhausted {
        streak: FailureStreak,
        policy: FailurePolicy,
    },
    /// The source itself stopped delivering (a queue's server, stream or consumer is
    /// gone and is being re-created).
    SourceLost,
    /// The source delivers again after [`SubscriptionInput::SourceLost`].
    SourceRestored,
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

impl Transition {
    /// True when the subscription's failure streak is cleared with this change (`consecutive_failures
    /// = 0`, `first_failure_at = NULL`): whenever it becomes `active` (an operator resume, or a
    /// delivered attempt closing the breaker), so it starts from a clean streak.
    pub fn resets_streak(&self) -> bool {
        self.to == SubscriptionState::Active
    }
}

/// True when the breaker trips: at least `threshold` (> 0) consecutive failures AND no success for the
/// policy's `failure_window_ms`.
pub fn breaker_trips(streak: &FailureStreak, threshold: u32, policy: &FailurePolicy) -> bool {
    threshold > 0
        && streak.failures_since >= threshold
        && streak.span_ms() >= policy.failure_window_ms
}

/// True when failure is continuous enough to dead-letter the subscription: the streak has lasted at
/// least `dead_letter_after_ms` and holds at least `dead_letter_min_failures` failed attempts.
pub fn continuous_failure(streak: &FailureStreak, policy: &FailurePolicy) -> bool {
    streak.failures_since >= policy.dead_letter_min_failures.max(1)
        && streak.span_ms() >= policy.dead_letter_after_ms
}

/// The subscription state machine. Returns `None` when the input changes nothing.
///
/// * `active -> paused` / `failed -> paused` / `dead-lettered -> paused` on pause (`operator-paused`);
///   `paused|failed|dead-lettered -> active` on resume.
/// * `active -> failed` when [`breaker_trips`]; `failed -> active` on a successful attempt.
/// * `active|failed -> dead-lettered` when a delivery is exhausted under [`continuous_failure`]
///   (`retry-exhausted`); only an operator resume leaves `dead-lettered`.
/// * `active -> failed` when its source is lost (`source-removed`); `failed -> active` when it is
///   restored. A paused or dead-lettered subscription stays as it is.
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
        // `operator-paused`: pause and resume emit state.changed with operator-paused.
        (_, I::OperatorResume) => (S::Active, Some(StateChangeReason::OperatorPaused)),
        (
            S::Active,
            I::AttemptFailed {
                streak,
                threshold,
                policy,
            },
        ) if breaker_trips(&streak, threshold, &policy) => (S::Failed, None),
        (S::Failed, I::AttemptDelivered) => (S::Active, None),
        (S::Active, I::SourceLost) => (S::Failed, Some(StateChangeReason::SourceRemoved)),
        (S::Failed, I::SourceRestored) => (S::Active, None),
        (S::Active | S::Failed, I::DeliveryExhausted { streak, policy })
            if continuous_failure(&streak, &policy) =>
        {
            (S::DeadLettered, Some(StateChangeReason::RetryExhausted))
        }
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
    #[test]
    fn a_success_writes_the_row_only_when_something_changes() {
        // A streak to reset: always written.
        assert!(success_needs_write(Some(9_900), 2, Some(9_000), 10_000));
        assert!(success_needs_write(Some(9_900), 0, Some(9_000), 10_000));
        // No streak: written only when last_success_at is unset or a resolution old.
        assert!(success_needs_write(None, 0, None, 10_000));
        assert!(!success_needs_write(Some(9_001), 0, None, 10_000));
        assert!(success_needs_write(Some(9_000), 0, None, 10_000));
        // A clock that went back never forces a write.
        assert!(!success_needs_write(Some(11_000), 0, None, 10_000));
    }

    use super::*;
    use SubscriptionInput as I;
    use SubscriptionState as S;

    fn to(s: S, i: I) -> Option<S> {
        transition(s, i).map(|t| t.to)
    }

    #[test]
    fn a_lost_source_fails_the_subscription_and_its_return_restores_it() {
        assert_eq!(to(S::Active, I::SourceLost), Some(S::Failed));
        assert_eq!(
            transition(S::Active, I::SourceLost).unwrap().reason,
            Some(StateChangeReason::SourceRemoved)
        );
        assert_eq!(to(S::Failed, I::SourceRestored), Some(S::Active));
        assert_eq!(to(S::Failed, I::SourceLost), None);
        assert_eq!(to(S::Paused, I::SourceLost), None);
        assert_eq!(to(S::DeadLettered, I::SourceRestored), None);
        assert_eq!(to(S::Active, I::SourceRestored), None);
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

    const MIN: i64 = 60_000;

    fn policy() -> FailurePolicy {
        FailurePolicy {
            failure_window_ms: 60_000,
            dead_letter_after_ms: 3_600_000,
            dead_letter_min_failures: 5,
        }
    }

    /// A streak of `n` failures that started `span` ms ago.
    fn streak(n: u32, span: i64) -> FailureStreak {
        FailureStreak {
            last_success_at: Some(1_000),
            failures_since: n,
            first_failure_at: 10_000,
            now: 10_000 + span,
        }
    }

    fn failed(n: u32, span: i64, threshold: u32) -> I {
        I::AttemptFailed {
            streak: streak(n, span),
            threshold,
            policy: policy(),
        }
    }

    fn exhausted(n: u32, span: i64) -> I {
        I::DeliveryExhausted {
            streak: streak(n, span),
            policy: policy(),
        }
    }

    #[test]
    fn breaker_needs_consecutive_failures_and_a_window_without_success() {
        // (state, failures in the streak, streak span ms, threshold) -> new state
        let table: &[(S, u32, i64, u32, Option<S>)] = &[
            (S::Active, 2, 10 * MIN, 3, None),            // too few
            (S::Active, 3, 10 * MIN, 3, Some(S::Failed)), // enough, long enough
            (S::Active, 3, MIN, 3, Some(S::Failed)),      // exactly the window
            (S::Active, 30, 999, 3, None),                // a burst within a second: no flap
            (S::Active, 99, 10 * MIN, 0, None),           // 0 disables
            (S::Failed, 4, 10 * MIN, 3, None),            // already failed
            (S::Paused, 9, 10 * MIN, 3, None),            // paused ignores outcomes
            (S::DeadLettered, 9, 10 * MIN, 3, None),
        ];
        for &(s, n, span, th, want) in table {
            assert_eq!(
                to(s, failed(n, span, th)),
                want,
                "{s:?} n={n} span={span} th={th}"
            );
        }
        assert_eq!(to(S::Failed, I::AttemptDelivered), Some(S::Active));
        assert_eq!(to(S::Active, I::AttemptDelivered), None);
    }

    #[test]
    fn dead_lettering_needs_continuous_failure_over_the_window_and_the_count() {
        let table: &[(S, u32, i64, Option<S>)] = &[
            (S::Active, 5, 3_600_000, Some(S::DeadLettered)),
            (S::Failed, 50, 7_200_000, Some(S::DeadLettered)),
            (S::Active, 4, 7_200_000, None), // long but too few failures
            (S::Active, 500, 3_599_999, None), // many but not long enough
            (S::Active, 3, 1, None),         // the old rule's case: one exhausted delivery
            (S::Paused, 50, 7_200_000, None),
            (S::DeadLettered, 50, 7_200_000, None),
        ];
        for &(s, n, span, want) in table {
            assert_eq!(to(s, exhausted(n, span)), want, "{s:?} n={n} span={span}");
        }
        let t = transition(S::Failed, exhausted(5, 3_600_000)).unwrap();
        assert_eq!(t.reason, Some(StateChangeReason::RetryExhausted));
        assert_eq!(
            to(S::DeadLettered, I::AttemptDelivered),
            None,
            "only an operator resumes"
        );
        let zero = FailurePolicy {
            dead_letter_min_failures: 0,
            ..policy()
        };
        assert!(zero.validate().is_err());
        assert!(FailurePolicy::default().validate().is_ok());
    }

    #[test]
    fn streak_restarts_after_a_success_and_keeps_its_start_otherwise() {
        let s = FailureStreak::next(Some(5), 0, Some(1), 100);
        assert_eq!(
            (s.failures_since, s.first_failure_at, s.span_ms()),
            (1, 100, 0)
        );
        let s = FailureStreak::next(Some(5), 3, Some(40), 100);
        assert_eq!(
            (s.failures_since, s.first_failure_at, s.span_ms()),
            (4, 40, 60)
        );
        let back = FailureStreak::next(None, 3, Some(400), 100);
        assert_eq!(
            back.span_ms(),
            0,
            "a clock step back never counts as time failing"
        );
    }

    /// Every other attempt fails (a deterministic 50 % pattern): the streak never exceeds one failure,
    /// so neither the breaker nor dead-lettering ever fires, however long it runs.
    #[test]
    fn alternating_failures_never_trip_or_dead_letter() {
        let mut state = S::Active;
        let (mut failures, mut first, mut last_ok) = (0u32, None, None);
        for i in 0..10_000i64 {
            let now = i * 60_000;
            if i % 2 == 0 {
                let st = FailureStreak::next(last_ok, failures, first, now);
                (failures, first) = (st.failures_since, Some(st.first_failure_at));
                for input in [failed_with(st, 3), exhausted_with(st)] {
                    if let Some(t) = transition(state, input) {
                        state = t.to;
                    }
                }
            } else {
                (failures, first, last_ok) = (0, None, Some(now));
                if let Some(t) = transition(state, I::AttemptDelivered) {
                    state = t.to;
                }
            }
            assert_eq!(state, S::Active, "step {i}");
        }
    }

    fn failed_with(streak: FailureStreak, threshold: u32) -> I {
        I::AttemptFailed {
            streak,
            threshold,
            policy: FailurePolicy {
                failure_window_ms: 0,
                ..policy()
            },
        }
    }

    fn exhausted_with(streak: FailureStreak) -> I {
        I::DeliveryExhausted {
            streak,
            policy: FailurePolicy {
                dead_letter_after_ms: 0,
                dead_letter_min_failures: 2,
                ..policy()
            },
        }
    }

    #[test]
    fn becoming_active_resets_the_streak() {
        let resume = transition(S::Failed, I::OperatorResume).unwrap();
        assert!(resume.resets_streak());
        assert!(!transition(S::Active, I::OperatorPause)
            .unwrap()
            .resets_streak());
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
