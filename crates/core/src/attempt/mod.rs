//! What one delivery attempt writes (DESIGN §4 Delivery, "Crash anywhere"; architecture §9 step 1).
//!
//! [`after_attempt`] is the ONE place the consequences of an attempt are decided: the delivery's next
//! state and due time, the attempt record, the `trigger.delivery.attempted` event, the run it starts and
//! that run's first events, the receipt's settled state, and the subscription's failure streak and
//! state transition. A backend loads an [`AttemptSnapshot`] under lock, calls it, and writes the
//! returned [`AttemptWrites`] in the same transaction; it decides nothing itself.
//!
//! Lock order: the delivery row, then the run a local effect acts on (the session rules lock it), then
//! the receipt row, then the subscription row. Session paths that consume a delivery lock the run, then
//! the delivery, then the receipt; both orders agree on run -> receipt and delivery -> receipt, and a
//! delivery is consumed only after its attempt committed, so no two transactions wait in a circle.

mod ingest;
mod lost;
mod run_log;
mod streak;
#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::delivery::{dead_letter_reason, AttemptDecision, AttemptOutcome, DeliveryState};
use crate::events::{self, DeliveryAttempted};
use crate::lease::{self, Completion, LeaseLost, LeaseRow};
use crate::receipt::{self, DeliveryView, ReceiptState};
use crate::run::RunStatus;
use crate::subscription::{FailurePolicy, Source, SubscriptionState, Transition};

pub use ingest::{dead_lettered_at_ingest, IngestDeadLetter, SUBSCRIPTION_DEAD_LETTERED};
pub use lost::{lost, LostWrites, LOST_MESSAGE};
pub use run_log::first_events;

/// The delivery row, loaded `FOR UPDATE` (first lock of the attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub receipt_id: String,
    /// The trigger subscription, or a pseudo one (`api`) that has no subscription row.
    pub subscription_id: String,
    pub dedup_key: String,
    /// State, attempts so far, lease token and end.
    pub lease: LeaseRow,
    /// The run it started or targeted, once known.
    pub run_id: Option<String>,
    /// Start of its first attempt, Unix ms.
    pub first_attempt_at: Option<i64>,
}

/// Another delivery of the same receipt, as receipt settlement sees it (read after the receipt row's
/// lock, in a later statement; see [`receipt::settled_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiblingDelivery {
    pub state: DeliveryState,
    pub dead_letter_reason: Option<String>,
    /// `consumed_at IS NOT NULL`.
    pub consumed: bool,
}

/// The receipt row (locked `FOR UPDATE` after the delivery) and its OTHER deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptRow {
    pub state: ReceiptState,
    /// Every delivery of the receipt except the one attempted.
    pub others: Vec<SiblingDelivery>,
}

/// The subscription row, locked `FOR UPDATE` after the receipt: its state and failure streak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionRow {
    pub id: String,
    pub source: Source,
    pub state: SubscriptionState,
    /// Breaker threshold, consecutive failures (0 never trips).
    pub failure_threshold: u32,
    /// Last delivered attempt, Unix ms.
    pub last_success_at: Option<i64>,
    /// Failed attempts since then (`consecutive_failures`).
    pub consecutive_failures: u32,
    /// Start of the first of them, Unix ms.
    pub first_failure_at: Option<i64>,
}

/// Everything [`after_attempt`] reads, loaded in the transaction that will write its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSnapshot {
    pub delivery: DeliveryRow,
    /// `None` when the delivery has no receipt row: an outbound webhook delivery references the run
    /// event it sends, not a receipt. Nothing is settled then.
    pub receipt: Option<ReceiptRow>,
    /// `None` when the delivery's subscription has no row (runs started through `POST /v1/runs`): no
    /// streak and no transition then. A backend may load it without a lock first and lock it only when
    /// [`AttemptWrites::subscription`] is `Some`, then ask [`after_attempt`] again on the locked row.
    pub subscription: Option<SubscriptionRow>,
    /// Whether a run with the id of the run to start already exists. A backend may assume `false`,
    /// insert the run row `ON CONFLICT (id) DO NOTHING`, and on a conflict ask again with `true` (the
    /// answer then differs only in [`AttemptWrites::run`]: an existing run is never written again).
    pub run_exists: bool,
}

/// A run the attempt starts (the worker's `NewRun`, minus what only the store needs).
#[derive(Debug, Clone, PartialEq)]
pub struct RunStart {
    /// `run_<32 hex>`.
    pub id: String,
    pub workflow_id: String,
    pub inputs: Value,
    /// `completed` (noop; an http worker answering 200/201/204), `running` (202), or `failed` for a
    /// dead-lettered API run.
    pub status: RunStatus,
    /// Set when the run exhausted its start retries (RFC 0053): `(reason, attempts)`.
    pub dead_letter: Option<(String, u32)>,
    /// A session run (its start turn and mailbox are written by the session rules after the run).
    pub session: bool,
}

/// What a local effect (session start with coalescing, signal, prompt) did, applied in the same
/// transaction after [`lease::accepts_completion`] and before [`after_attempt`].
#[derive(Debug, Clone, PartialEq)]
pub struct EffectDone {
    /// The run it started or acted on.
    pub run_id: String,
    /// The session run it started (a coalesced start that joined a live session starts none).
    pub started: Option<RunStart>,
    /// Its effect was consumed at once (run started; signal or prompt taken by a wait).
    pub consumed: bool,
}

/// Why an attempt failed (absent for a delivered attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptFailure {
    /// Short content-free class, e.g. `http_500`, `timeout`, `binding_revoked`.
    pub error_class: String,
    /// Sanitized message (`crate::delivery::http_failure_message`), if any.
    pub message: Option<String>,
    /// The failure can never succeed (the delivery dead-letters under its own class).
    pub permanent: bool,
}

/// The worker's account of one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptReport {
    /// The lease token it ran under and its attempt number (1-based).
    pub lease: Completion,
    /// Id of its `trigger.delivery.attempted` event (`evt_<32 hex>`): the started run's causation.
    pub event_id: String,
    /// `crate::delivery::decide` under the subscription's retry policy (plus one attempt per replay).
    pub decision: AttemptDecision,
    pub failure: Option<AttemptFailure>,
    /// When the attempt started, Unix ms (worker clock; it dates the failure streak).
    pub started_at: i64,
    /// How long it took, ms.
    pub duration_ms: u64,
    /// The run a delivered (or dead-lettered API) start creates.
    pub run: Option<RunStart>,
    /// The local effect applied in this transaction, if any.
    pub effect: Option<EffectDone>,
    /// The subscription's failure policy (its config).
    pub failure_policy: FailurePolicy,
}

impl AttemptReport {
    /// The run this attempt would start: the session its effect started, else [`AttemptReport::run`]. A
    /// backend checks whether it exists already ([`AttemptSnapshot::run_exists`]).
    pub fn run_to_start(&self) -> Option<&RunStart> {
        match &self.effect {
            Some(e) => e.started.as_ref().or(self.run.as_ref()),
            None => self.run.as_ref(),
        }
    }
}

/// The `attempts` row to insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub delivery_id: String,
    pub attempt: u32,
    pub event_id: String,
    pub outcome: AttemptOutcome,
    pub error_class: Option<String>,
    pub message: Option<String>,
    /// Unix ms.
    pub started_at: i64,
    /// ms.
    pub duration_ms: u64,
    /// Unix ms, when it retries.
    pub next_due_at: Option<i64>,
}

/// The delivery row's update. Always also clears `lease_owner`, `lease_token` and `lease_until`, fenced
/// on the token: `UPDATE deliveries SET ... WHERE id = ?1 AND lease_token = ?2`; zero rows is
/// [`lease::fenced`]'s `RaceLost`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryUpdate {
    pub state: DeliveryState,
    /// The attempt's number.
    pub attempts: u32,
    /// Unix ms; `None` once terminal.
    pub due_at: Option<i64>,
    /// Unix ms: the stored one, else this attempt's start.
    pub first_attempt_at: i64,
    /// The attempt's error class.
    pub last_error: Option<String>,
    pub dead_letter_reason: Option<String>,
    /// Unix ms.
    pub updated_at: i64,
    /// The stored run id, else the run started or targeted.
    pub run_id: Option<String>,
    /// Unix ms when its effect was consumed by this attempt, else `NULL`.
    pub consumed_at: Option<i64>,
}

/// A run-less trigger event to insert into `subscription_events`.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionEvent {
    pub event_id: String,
    pub subscription_id: String,
    /// `trigger.delivery.attempted` or `trigger.subscription.state.changed`.
    pub event_type: &'static str,
    pub payload: Value,
    /// The delivery whose attempt caused it.
    pub delivery_id: Option<String>,
    /// Unix ms.
    pub timestamp: i64,
}

/// One event of a run's log. Each one appended fans out to the outbox (`crate::outbox::fan_out`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// From 0.
    pub sequence: u64,
    pub event_id: String,
    pub event_type: &'static str,
    pub payload: Value,
    pub causation_id: Option<String>,
}

/// The run to insert, with its first events.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCreate {
    pub id: String,
    pub workflow_id: String,
    pub status: RunStatus,
    pub inputs: Value,
    pub delivery_id: String,
    pub receipt_id: String,
    pub subscription_id: String,
    /// The attempt's event id.
    pub causation_id: String,
    /// The run row's `next_sequence`: the sequence its next event takes.
    pub next_sequence: u64,
    /// Unix ms (`created_at`, `updated_at`, every event's timestamp).
    pub created_at: i64,
    pub events: Vec<RunEvent>,
    /// Start its session (start turn, mailbox) after the run row: a session run that did not
    /// dead-letter.
    pub start_session: bool,
}

/// The subscription's failure-streak columns after the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreakUpdate {
    /// Delivered: `consecutive_failures = 0, first_failure_at = NULL, last_success_at`.
    Reset { last_success_at: i64 },
    /// Failed: the streak counting this attempt, and `last_error` (`class: message`).
    Failed {
        consecutive_failures: u32,
        first_failure_at: i64,
        last_error: Option<String>,
    },
}

/// The subscription row's update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionUpdate {
    pub id: String,
    pub streak: StreakUpdate,
    /// The new state, when it changed (`state`, `updated_at = state_changed_at = now`).
    pub state: Option<SubscriptionState>,
}

/// Everything an attempt writes, in this order: `attempt`, `delivery`, `events` (the attempted event
/// first, then each state change), `run` (row, then events with their outbox fan-out, then the
/// session), `receipt_state`, `subscription`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptWrites {
    pub attempt: AttemptRow,
    pub delivery: DeliveryUpdate,
    pub events: Vec<SubscriptionEvent>,
    /// `None` also when the run already exists ([`AttemptSnapshot::run_exists`]): its log was written
    /// when it was created and is never rewritten.
    pub run: Option<RunCreate>,
    /// `UPDATE receipts SET state, updated_at = now` when `Some`.
    pub receipt_state: Option<ReceiptState>,
    /// `None` when the subscription row is neither to be written nor locked (see [`after_attempt`]).
    pub subscription: Option<SubscriptionUpdate>,
    /// The run the delivery started or targeted (answered to the worker).
    pub run_id: Option<String>,
    /// The subscription's change over the whole attempt (`from` = its state before, `to` = after), to
    /// announce; `None` when it did not change.
    pub transition: Option<Transition>,
}

/// Decides what attempt `report` of the delivery in `snapshot` writes, at `now` (store clock, Unix
/// ms: `updated_at`, the due time of a retry, event timestamps, `consumed_at`, `last_success_at`).
///
/// * Lease: refused unless [`lease::accepts_completion`] (token, open delivery, next attempt number).
/// * Delivery: state and outcome from the decision; a retry is due at `now + delay_ms`; a dead letter
///   keeps a permanent failure's class as its reason, else `retries_exhausted`
///   ([`dead_letter_reason`]); the run id is kept once set; `consumed_at` is set when the effect was
///   consumed (or, without an effect, when a delivered attempt started a run).
/// * Event: `trigger.delivery.attempted` (`runId` only when delivered) under the report's event id,
///   as a subscription event, except for a delivery without a subscription row (an API start) whose
///   attempt starts a run that logs this event: the run log holds it, and nothing reads a
///   pseudo-subscription's events.
/// * Run: the effect's started session, else the report's run, unless it already exists; its log is
///   [`first_events`].
/// * Receipt: settled only when the delivery became terminal and has a receipt row
///   ([`receipt::settled_state`]).
/// * Subscription: policy refusals (`receipt::is_policy_refusal`) and runs without a subscription row
///   change nothing, and neither does a delivered attempt of an `active` subscription with no failure
///   streak and a fresh `last_success_at` (`crate::subscription::success_needs_write` false): then
///   `subscription` is `None` and a backend neither locks nor writes the row (a busy subscription's
///   attempts do not queue behind it). Otherwise the streak and the state machine
///   (`crate::subscription::transition`).
///
/// Errors: [`LeaseLost`] (nothing may be written; the store answers `StoreError::LeaseLost`).
pub fn after_attempt(
    snapshot: &AttemptSnapshot,
    report: &AttemptReport,
    now: i64,
) -> Result<AttemptWrites, LeaseLost> {
    let d = &snapshot.delivery;
    lease::accepts_completion(&d.lease, &report.lease)?;
    let (outcome, state) = report.decision.outcome();
    let next_due_at = match report.decision {
        AttemptDecision::Retry { delay_ms } => {
            Some(now.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX)))
        }
        _ => None,
    };
    let error_class = report.failure.as_ref().map(|f| f.error_class.clone());
    let dl_reason = dead_letter_reason(
        report.decision,
        error_class.as_deref(),
        report.failure.as_ref().is_some_and(|f| f.permanent),
    );
    let to_start = report.run_to_start();
    let target = match &report.effect {
        Some(e) => Some(e.run_id.clone()),
        None => report.run.as_ref().map(|r| r.id.clone()),
    };
    let consumed = match &report.effect {
        Some(e) => e.consumed,
        None => report.run.is_some() && outcome == AttemptOutcome::Delivered,
    };
    let attempt = report.lease.attempt;

    let attempted = DeliveryAttempted {
        subscription_id: d.subscription_id.clone(),
        dedup_key: d.dedup_key.clone(),
        attempt,
        outcome,
        run_id: target
            .clone()
            .filter(|_| outcome == AttemptOutcome::Delivered),
    };
    let attempted = serde_json::to_value(attempted).expect("serializable");
    let mut events = vec![SubscriptionEvent {
        event_id: report.event_id.clone(),
        subscription_id: d.subscription_id.clone(),
        event_type: events::DELIVERY_ATTEMPTED,
        payload: attempted.clone(),
        delivery_id: Some(d.id.clone()),
        timestamp: now,
    }];

    let run = to_start
        .filter(|_| !snapshot.run_exists)
        .map(|r| run_log::create(r, d, &report.event_id, &attempted, now));
    let logged = run
        .as_ref()
        .is_some_and(|r| r.events.iter().any(|e| e.event_id == report.event_id));
    if snapshot.subscription.is_none() && logged {
        // A pseudo-subscription (`api`) has no subscription row and no reader of its events: the
        // attempt's event is kept once, in the log of the run it starts.
        events.clear();
    }

    let receipt_state = match &snapshot.receipt {
        Some(receipt) if state.is_terminal() => {
            let mut views: Vec<DeliveryView<'_>> = receipt
                .others
                .iter()
                .map(|o| DeliveryView {
                    state: o.state,
                    reason: o.dead_letter_reason.as_deref(),
                    consumed: o.consumed,
                })
                .collect();
            views.push(DeliveryView {
                state,
                reason: dl_reason.as_deref(),
                consumed,
            });
            receipt::settled_state(receipt.state, &views)
        }
        _ => None,
    };

    let policy_refusal =
        outcome != AttemptOutcome::Delivered && receipt::is_policy_refusal(error_class.as_deref());
    let (subscription, transition) = match &snapshot.subscription {
        Some(sub) if !policy_refusal && !streak::untouched(sub, outcome, now) => {
            let s = streak::judge(sub, report, outcome, now);
            events.extend(
                s.events
                    .into_iter()
                    .map(|(event_id, payload)| SubscriptionEvent {
                        event_id,
                        subscription_id: sub.id.clone(),
                        event_type: events::SUBSCRIPTION_STATE_CHANGED,
                        payload,
                        delivery_id: Some(d.id.clone()),
                        timestamp: now,
                    }),
            );
            (Some(s.update), s.transition)
        }
        _ => (None, None),
    };

    Ok(AttemptWrites {
        attempt: AttemptRow {
            delivery_id: d.id.clone(),
            attempt,
            event_id: report.event_id.clone(),
            outcome,
            error_class: error_class.clone(),
            message: report.failure.as_ref().and_then(|f| f.message.clone()),
            started_at: report.started_at,
            duration_ms: report.duration_ms,
            next_due_at,
        },
        delivery: DeliveryUpdate {
            state,
            attempts: attempt,
            due_at: next_due_at,
            first_attempt_at: d.first_attempt_at.unwrap_or(report.started_at),
            last_error: error_class,
            dead_letter_reason: dl_reason,
            updated_at: now,
            run_id: d.run_id.clone().or_else(|| target.clone()),
            consumed_at: consumed.then_some(now),
        },
        events,
        run,
        receipt_state,
        subscription,
        run_id: target,
        transition,
    })
}
