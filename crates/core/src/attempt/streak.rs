//! The subscription side of an attempt: its failure streak and what the state machine makes of it
//! (the rules themselves are `crate::subscription`'s; this gathers their inputs and outputs).

use serde_json::Value;

use super::{AttemptReport, StreakUpdate, SubscriptionRow, SubscriptionUpdate};
use crate::delivery::AttemptOutcome;
use crate::events::SubscriptionStateChanged;
use crate::ids::{new_id, IdKind};
use crate::subscription::{
    success_needs_write, transition, FailureStreak, SubscriptionInput, SubscriptionState,
    Transition,
};

/// What an attempt does to its subscription.
pub(super) struct Judged {
    pub update: SubscriptionUpdate,
    /// `trigger.subscription.state.changed` events, in order: (event id, payload).
    pub events: Vec<(String, Value)>,
    /// The whole change (from the state before to the state after), if any.
    pub transition: Option<Transition>,
}

/// True when an attempt announced as `outcome` at `now` (Unix ms) leaves subscription `sub` exactly as
/// it is: delivered, `active`, and [`success_needs_write`] false (no streak to reset, `last_success_at`
/// fresher than `crate::subscription::LAST_SUCCESS_RESOLUTION_MS`). Its row is then neither written nor
/// locked.
pub(super) fn untouched(sub: &SubscriptionRow, outcome: AttemptOutcome, now: i64) -> bool {
    outcome == AttemptOutcome::Delivered
        && sub.state == SubscriptionState::Active
        && !success_needs_write(
            sub.last_success_at,
            sub.consecutive_failures,
            sub.first_failure_at,
            now,
        )
}

/// Judges attempt `report` (announced as `outcome`) at `now` (Unix ms) for subscription `sub`:
/// delivered resets the streak and may close the breaker; a failure extends the streak (dated by the
/// attempt's start) and may trip the breaker, and a dead-lettering failure may dead-letter the
/// subscription, both in one attempt (`active -> failed -> dead-lettered`).
pub(super) fn judge(
    sub: &SubscriptionRow,
    report: &AttemptReport,
    outcome: AttemptOutcome,
    now: i64,
) -> Judged {
    let policy = report.failure_policy;
    let (streak, inputs) = if outcome == AttemptOutcome::Delivered {
        (
            StreakUpdate::Reset {
                last_success_at: now,
            },
            vec![SubscriptionInput::AttemptDelivered],
        )
    } else {
        let streak = FailureStreak::next(
            sub.last_success_at,
            sub.consecutive_failures,
            sub.first_failure_at,
            report.started_at,
        );
        let mut inputs = vec![SubscriptionInput::AttemptFailed {
            streak,
            threshold: sub.failure_threshold,
            policy,
        }];
        if outcome == AttemptOutcome::DeadLettered {
            inputs.push(SubscriptionInput::DeliveryExhausted { streak, policy });
        }
        let last_error = report.failure.as_ref().map(|f| match &f.message {
            Some(m) => format!("{}: {m}", f.error_class),
            None => f.error_class.clone(),
        });
        (
            StreakUpdate::Failed {
                consecutive_failures: streak.failures_since,
                first_failure_at: streak.first_failure_at,
                last_error,
            },
            inputs,
        )
    };
    let mut state = sub.state;
    let mut events = Vec::new();
    let mut whole = None;
    for input in inputs {
        if let Some(t) = transition(state, input) {
            let payload =
                serde_json::to_value(SubscriptionStateChanged::of(&sub.id, sub.source, &t))
                    .expect("serializable");
            events.push((new_id(IdKind::Event), payload));
            state = t.to;
            whole = Some(Transition {
                from: sub.state,
                ..t
            });
        }
    }
    Judged {
        update: SubscriptionUpdate {
            id: sub.id.clone(),
            streak,
            state: (state != sub.state).then_some(state),
        },
        events,
        transition: whole,
    }
}
