//! The commit of one delivery attempt: load what `tb_core::attempt::after_attempt` reads, under lock,
//! call it, write what it returned. Nothing is decided here.
//!
//! Locks, in this order (architecture §9): the delivery row (`FOR UPDATE`), the run a local effect acts
//! on (the session code locks it), the receipt row, then the subscription row, and that one only when
//! the rule writes it: a delivered attempt of an active subscription with no failure streak (and a
//! fresh enough `last_success_at`) neither locks nor writes it, so a busy subscription's attempts do not
//! queue behind one row. The subscription is first read without a lock; when the rule's answer writes
//! it, the row is locked, read again, and the rule asked again on what the lock holds.

use crate::p;
use crate::sql::Db;
use serde_json::Value;
use tb_core::attempt::{
    after_attempt, AttemptReport, AttemptSnapshot, AttemptWrites, DeliveryRow, EffectDone,
    ReceiptRow, RunCreate, RunStart, SiblingDelivery, StreakUpdate, SubscriptionRow,
};
use tb_core::delivery::DeliveryState;
use tb_core::lease::{self, LeaseRow};
use tb_core::receipt::ReceiptState;
use tb_core::signal::MailboxPolicy;

use super::lease::{lock_lease, lost};
use super::log::{insert_attempt, insert_event, RunLog};
use super::read::{self, bad};
use crate::model::*;
use crate::session::Effect;
use crate::session::NewRun;
use crate::{StoreError, StoreResult};

/// Records attempt `a` (see [`AttemptCommit`]). Errors: `LeaseLost` (nothing written: another token,
/// a terminal delivery, an attempt already recorded, or the fenced update lost); `Rejected` when the
/// local effect is refused (the caller rolls everything back); `NotFound("delivery")`.
pub(crate) fn commit_attempt(c: &dyn Db, a: &AttemptCommit) -> StoreResult<AttemptCommitted> {
    let id = a.delivery_id.as_str();
    let (d, lease_row) = lock_lease(c, id)?;
    // The lease is checked before a local effect runs: a stale holder must not raise a signal.
    lease::accepts_completion(&lease_row, &a.report.lease).map_err(lost(id))?;
    let (filled, session) = match &a.effect {
        Some(e) => {
            let (done, session) = apply_effect(c, e, a.now)?;
            let mut r = a.report.clone();
            r.effect = Some(done);
            (Some(r), session)
        }
        None => (None, None),
    };
    let report = filled.as_ref().unwrap_or(&a.report);
    let mut snapshot = load(c, &d, lease_row, report)?;
    let mut writes = after_attempt(&snapshot, report, a.now).map_err(lost(id))?;
    if writes.subscription.is_some() {
        // The rule writes the subscription: decide again on the row as its lock holds it.
        let sub = read::lock_subscription(c, &d.subscription_id)?;
        snapshot.subscription = Some(subscription_row(&sub));
        writes = after_attempt(&snapshot, report, a.now).map_err(lost(id))?;
    }
    apply(
        c,
        &writes,
        &d.receipt_id,
        &a.report.lease.token,
        session,
        a.now,
    )?;
    Ok(AttemptCommitted {
        subscription_transition: writes.transition,
        run_id: writes.run_id,
    })
}

/// Performs the local effect, and says what it did in the rule's terms; a session it starts comes
/// with its start turn's content and mailbox policy (written after the run row).
fn apply_effect(
    c: &dyn Db,
    e: &Effect,
    now: i64,
) -> StoreResult<(EffectDone, Option<(Value, MailboxPolicy)>)> {
    let done = super::session::apply_effect(c, e, now)?;
    let (started, session) = match (done.start, e) {
        (true, Effect::StartSession { run, .. }) => (Some(run_start(run)), run.session.clone()),
        _ => (None, None),
    };
    Ok((
        EffectDone {
            run_id: done.run_id,
            started,
            consumed: done.consumed,
        },
        session,
    ))
}

/// The rule's view of a run to start.
pub(crate) fn run_start(run: &NewRun) -> RunStart {
    RunStart {
        id: run.id.clone(),
        workflow_id: run.workflow_id.clone(),
        inputs: run.inputs.clone(),
        status: run.status,
        dead_letter: run.dead_letter.clone(),
        session: run.session.is_some(),
    }
}

/// Loads the snapshot after the delivery's lock: the run to start (does it exist?), the receipt row
/// (`FOR UPDATE`) and then, in a later statement, its other deliveries; the subscription unlocked.
fn load(
    c: &dyn Db,
    d: &DeliveryRecord,
    lease: LeaseRow,
    report: &AttemptReport,
) -> StoreResult<AttemptSnapshot> {
    let run_exists = match report.run_to_start() {
        Some(r) => c
            .value::<i64>("SELECT 1 FROM runs WHERE id = ?1", p![r.id])?
            .is_some(),
        None => false,
    };
    // An outbound webhook delivery references the run event it sends, not a receipt: no row then.
    let state: Option<String> = c.value(
        &format!(
            "SELECT state FROM receipts WHERE id = ?1{}",
            c.dialect().for_update()
        ),
        p![d.receipt_id],
    )?;
    let receipt = match state {
        None => None,
        Some(state) => Some(ReceiptRow {
            state: ReceiptState::parse(&state).ok_or_else(|| bad("receipt state", &state))?,
            others: c.rows(
                "SELECT state, dead_letter_reason, consumed_at IS NOT NULL FROM deliveries \
                 WHERE receipt_id = ?1 AND id <> ?2",
                p![d.receipt_id, d.id],
                |r| {
                    let s: String = r.get(0)?;
                    Ok(SiblingDelivery {
                        state: DeliveryState::parse(&s).ok_or_else(|| bad("delivery state", &s))?,
                        dead_letter_reason: r.get(1)?,
                        consumed: r.get(2)?,
                    })
                },
            )?,
        }),
    };
    // Runs started through `POST /v1/runs` (and capability signals) have no subscription row.
    let subscription = match read::get_subscription(c, &d.subscription_id) {
        Ok(s) => Some(subscription_row(&s)),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e),
    };
    Ok(AttemptSnapshot {
        delivery: DeliveryRow {
            id: d.id.clone(),
            receipt_id: d.receipt_id.clone(),
            subscription_id: d.subscription_id.clone(),
            dedup_key: d.dedup_key.clone(),
            lease,
            run_id: d.run_id.clone(),
            first_attempt_at: d.first_attempt_at,
        },
        receipt,
        subscription,
        run_exists,
    })
}

fn subscription_row(s: &SubscriptionRecord) -> SubscriptionRow {
    SubscriptionRow {
        id: s.id.clone(),
        source: s.source,
        state: s.state,
        failure_threshold: s.failure_threshold,
        last_success_at: s.last_success_at,
        consecutive_failures: s.consecutive_failures,
        first_failure_at: s.first_failure_at,
    }
}

/// Writes `w` (of an attempt on a delivery of receipt `receipt_id`) in the rule's order. The delivery's update is fenced on `token` and goes first, so a lost
/// race is `LeaseLost` before anything else is written.
fn apply(
    c: &dyn Db,
    w: &AttemptWrites,
    receipt_id: &str,
    token: &str,
    session: Option<(Value, MailboxPolicy)>,
    now: i64,
) -> StoreResult<()> {
    let u = &w.delivery;
    let n = c.exec(
        "UPDATE deliveries SET state = ?3, attempts = ?4, due_at = ?5, lease_owner = NULL, lease_token = NULL, \
         lease_until = NULL, first_attempt_at = ?6, last_error = ?7, dead_letter_reason = ?8, updated_at = ?9, \
         run_id = ?10, consumed_at = ?11 WHERE id = ?1 AND lease_token = ?2",
        p![
            w.attempt.delivery_id,
            token,
            u.state.as_str(),
            u.attempts,
            u.due_at,
            u.first_attempt_at,
            u.last_error,
            u.dead_letter_reason,
            u.updated_at,
            u.run_id,
            u.consumed_at
        ],
    )?;
    lease::fenced(n).map_err(lost(&w.attempt.delivery_id))?;
    insert_attempt(c, &w.attempt)?;
    for e in &w.events {
        insert_event(c, e)?;
    }
    if let Some(run) = &w.run {
        insert_run(c, run)?;
        if let (true, Some((content, mailbox))) = (run.start_session, &session) {
            super::session::start_session(c, &run.id, content, mailbox, now)?;
        }
    }
    if let Some(state) = w.receipt_state {
        c.exec(
            "UPDATE receipts SET state = ?2, updated_at = ?3 WHERE id = ?1",
            p![receipt_id, state.as_str(), now],
        )?;
    }
    if let Some(s) = &w.subscription {
        match &s.streak {
            StreakUpdate::Reset { last_success_at } => c.exec(
                "UPDATE subscriptions SET consecutive_failures = 0, first_failure_at = NULL, \
                 last_success_at = ?2 WHERE id = ?1",
                p![s.id, last_success_at],
            )?,
            StreakUpdate::Failed {
                consecutive_failures,
                first_failure_at,
                last_error,
            } => c.exec(
                "UPDATE subscriptions SET consecutive_failures = ?2, first_failure_at = ?3, \
                 last_error = ?4 WHERE id = ?1",
                p![s.id, consecutive_failures, first_failure_at, last_error],
            )?,
        };
        if let Some(state) = s.state {
            c.exec(
                "UPDATE subscriptions SET state = ?2, updated_at = ?3, state_changed_at = ?3 WHERE id = ?1",
                p![s.id, state.as_str(), now],
            )?;
        }
    }
    Ok(())
}

/// Inserts the run row, then its first events (each fans out to the outbox).
fn insert_run(c: &dyn Db, r: &RunCreate) -> StoreResult<()> {
    c.exec(
        "INSERT INTO runs (id, workflow_id, status, inputs, delivery_id, receipt_id, subscription_id, causation_id, \
         next_sequence, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
        p![
            r.id,
            r.workflow_id,
            r.status.as_str(),
            r.inputs.to_string(),
            r.delivery_id,
            r.receipt_id,
            r.subscription_id,
            r.causation_id,
            r.next_sequence,
            r.created_at
        ],
    )?;
    let mut log = RunLog::new(c);
    for e in &r.events {
        log.append(
            &e.event_id,
            &r.id,
            e.sequence,
            e.event_type,
            &e.payload,
            e.causation_id.as_deref(),
            r.created_at,
        )?;
    }
    Ok(())
}
