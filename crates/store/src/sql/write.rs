//! Write transactions of the SQLite backend. Each function runs inside the writer's batch transaction (in
//! its own savepoint); an `Err` rolls back just that function's writes.

use crate::p;
use crate::sql::{Db, Dialect};
use serde_json::Value;
use tb_core::delivery::{AttemptOutcome, DeliveryState};
use tb_core::events::{self, DeliveryAttempted, RunStarted, SubscriptionStateChanged};
use tb_core::ids::{new_id, IdKind};
use tb_core::outbox;
use tb_core::receipt::{self, ReceiptState};
use tb_core::retention;
use tb_core::run::RunStatus;
use tb_core::subscription::{
    self, transition, FailureStreak, SubscriptionInput, SubscriptionState, Transition,
};

use super::read::{self, no_row};
use crate::model::*;
use crate::{StoreError, StoreResult};

pub(crate) fn upsert_subscription(
    c: &dyn Db,
    d: &SubscriptionDef,
    now: i64,
) -> StoreResult<SubscriptionRecord> {
    c.exec(
        "INSERT INTO subscriptions (id, source, connector, config, state, failure_threshold, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 'active', ?5, ?6, ?6) \
         ON CONFLICT(id) DO UPDATE SET source = excluded.source, connector = excluded.connector, \
         config = excluded.config, failure_threshold = excluded.failure_threshold, updated_at = excluded.updated_at", p![d.id, read::source_str(d.source), d.connector, d.config.to_string(), d.failure_threshold, now])?;
    read::get_subscription(c, &d.id)
}

/// `normalized` and `inputs` (one per delivery) are the JSON texts, serialized by the caller so the
/// writer thread does no serialization.
pub(crate) fn commit_receipt(
    c: &dyn Db,
    r: &NewReceipt,
    normalized: &str,
    inputs: &[String],
) -> StoreResult<IngestOutcome> {
    if let Some(cap) = &r.capability {
        super::session::use_capability(c, cap, r.received_at)?;
    }
    let inserted = c
        .exec(
            "INSERT INTO receipts (id, subscription_id, dedup_key, provider_event_id, event_type, normalized, state, \
             content_type, body_bytes, received_at, updated_at, dedup_until) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11) \
             ON CONFLICT (subscription_id, dedup_key) WHERE dedup_live = 1 DO NOTHING", p![
            r.id,
            r.subscription_id,
            r.dedup_key,
            r.provider_event_id,
            r.event_type,
            normalized,
            r.state.as_str(),
            r.content_type,
            r.body.len() as i64,
            r.received_at,
            r.dedup_until
        ])?;
    if inserted == 0 {
        // The key is taken. If its window has passed, release it and take it (rare path).
        let released = c.exec(
            "UPDATE receipts SET dedup_live = 0 WHERE subscription_id = ?1 AND dedup_key = ?2 \
                 AND dedup_live = 1 AND dedup_until <= ?3",
            p![r.subscription_id, r.dedup_key, r.received_at],
        )?;
        if released > 0 {
            return commit_receipt(c, r, normalized, inputs);
        }
        return read::duplicate_of(c, &r.subscription_id, &r.dedup_key, r.received_at)?
            .ok_or_else(|| StoreError::Database("dedup conflict without a receipt".into()));
    }
    c.exec(
        "INSERT INTO bodies (receipt_id, body) VALUES (?1, ?2)",
        p![r.id, &r.body[..]],
    )?;
    const INSERT_DELIVERY: &str =
        "INSERT INTO deliveries (id, receipt_id, subscription_id, binding_id, dedup_key, action, workflow_id, run_id, \
         inputs, state, due_at, dead_letter_reason, created_at, updated_at, params) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?14)";
    let mut refs = Vec::with_capacity(r.deliveries.len());
    for (d, inputs) in r.deliveries.iter().zip(inputs) {
        let due = (d.state == DeliveryState::Pending).then_some(r.received_at);
        c.exec(
            INSERT_DELIVERY,
            p![
                d.id,
                r.id,
                r.subscription_id,
                d.binding_id,
                r.dedup_key,
                d.action,
                d.workflow_id,
                d.run_id,
                inputs,
                d.state.as_str(),
                due,
                d.dead_letter_reason,
                r.received_at,
                d.params.as_ref().map(|p| p.to_string())
            ],
        )?;
        if d.state == DeliveryState::DeadLettered {
            dead_letter_at_ingest(c, r, d)?;
        }
        refs.push(DeliveryRef {
            delivery_id: d.id.clone(),
            binding_id: d.binding_id.clone(),
            run_id: d.run_id.clone(),
        });
    }
    Ok(IngestOutcome::Accepted {
        receipt_id: r.id.clone(),
        deliveries: refs,
    })
}

/// A delivery created dead-lettered (its subscription is dead-lettered) is recorded as attempt 1 with
/// outcome `dead-lettered` and its `trigger.delivery.attempted` event, so it appears in the dead-letter
/// read like any other (RFC 0232) and a replay continues at attempt 2.
fn dead_letter_at_ingest(c: &dyn Db, r: &NewReceipt, d: &NewDelivery) -> StoreResult<()> {
    let event_id = new_id(IdKind::Event);
    c.exec(
        "INSERT INTO attempts (delivery_id, attempt, event_id, outcome, error_class, started_at, duration_ms, next_due_at) \
         VALUES (?1, 1, ?2, 'dead-lettered', ?4, ?3, 0, NULL)", p![d.id, event_id, r.received_at, d.dead_letter_reason.as_deref().unwrap_or("subscription_dead_lettered")])?;
    c.exec(
        "UPDATE deliveries SET attempts = 1, first_attempt_at = ?2 WHERE id = ?1",
        p![d.id, r.received_at],
    )?;
    let payload = serde_json::to_value(DeliveryAttempted {
        subscription_id: r.subscription_id.clone(),
        dedup_key: r.dedup_key.clone(),
        attempt: 1,
        outcome: AttemptOutcome::DeadLettered,
        run_id: None,
    })
    .expect("serializable");
    insert_sub_event(
        c,
        &r.subscription_id,
        events::DELIVERY_ATTEMPTED,
        &payload,
        Some(&d.id),
        &event_id,
        r.received_at,
    )
}

pub(crate) fn lease_due(
    c: &dyn Db,
    owner: &str,
    now: i64,
    lease_ms: u64,
    limit: u32,
) -> StoreResult<Vec<Lease>> {
    let until = now + lease_ms as i64;
    // A lease moves `due_at` to the lease's end: a leased delivery is simply not due until its lease
    // lapses, so the due index alone finds work and never rescans work in flight. On SQLite the index is
    // named (without statistics the planner prefers deliveries_by_state and sorts every open row); on
    // PostgreSQL the rows are taken with SKIP LOCKED so replicas leasing at once take disjoint batches.
    let pick = match c.dialect() {
        Dialect::Sqlite => {
            "SELECT id FROM deliveries INDEXED BY deliveries_due \
             WHERE state IN ('pending','retrying') AND due_at <= ?3 ORDER BY due_at LIMIT ?4"
        }
        Dialect::Postgres => {
            "SELECT id FROM deliveries \
             WHERE state IN ('pending','retrying') AND due_at <= ?3 ORDER BY due_at LIMIT ?4 \
             FOR UPDATE SKIP LOCKED"
        }
    };
    let sql = format!(
        "UPDATE deliveries SET lease_owner = ?1, lease_until = ?2, due_at = ?2 WHERE id IN ({pick}) RETURNING {}",
        read::DELIVERY_COLS
    );
    let rows = c.rows(&sql, p![owner, until, now, limit], read::delivery_row)?;
    let mut out = Vec::with_capacity(rows.len());
    for delivery in rows {
        out.push(Lease {
            delivery,
            owner: owner.to_string(),
            lease_until: until,
            lease_ms,
        });
    }
    Ok(out)
}

pub(crate) fn renew_lease(
    c: &dyn Db,
    id: &str,
    owner: &str,
    lease_until: i64,
    now: i64,
    lease_ms: u64,
) -> StoreResult<Option<i64>> {
    let until = now + lease_ms as i64;
    let n = c.exec(
        "UPDATE deliveries SET lease_until = ?4, due_at = ?4 \
             WHERE id = ?1 AND lease_owner = ?2 AND lease_until = ?3 AND lease_until > ?5 \
             AND state IN ('pending','retrying')",
        p![id, owner, lease_until, until, now],
    )?;
    Ok((n == 1).then_some(until))
}

pub(crate) fn release_lease(c: &dyn Db, id: &str, owner: &str, now: i64) -> StoreResult<()> {
    c.exec(
        "UPDATE deliveries SET lease_owner = NULL, lease_until = NULL, due_at = ?3 WHERE id = ?1 AND lease_owner = ?2", p![id, owner, now])?;
    Ok(())
}

fn insert_sub_event(
    c: &dyn Db,
    sub: &str,
    ty: &str,
    payload: &Value,
    delivery: Option<&str>,
    id: &str,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "INSERT INTO subscription_events (event_id, subscription_id, type, payload, delivery_id, timestamp) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)", p![id, sub, ty, payload.to_string(), delivery, now])?;
    Ok(())
}

pub(crate) fn insert_run_event(
    c: &dyn Db,
    run: &str,
    seq: u64,
    ty: &str,
    payload: &Value,
    causation: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    insert_run_event_with_id(
        c,
        &new_id(IdKind::Event),
        run,
        seq,
        ty,
        payload,
        causation,
        now,
    )
}

/// [`insert_run_event`] with a given event id (the delivered attempt's event keeps its id on the run log).
#[allow(clippy::too_many_arguments)]
fn insert_run_event_with_id(
    c: &dyn Db,
    event_id: &str,
    run: &str,
    seq: u64,
    ty: &str,
    payload: &Value,
    causation: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "INSERT INTO run_events (run_id, sequence, event_id, type, payload, causation_id, timestamp) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)", p![run, seq as i64, event_id, ty, payload.to_string(), causation, now])?;
    // Outbox for outbound webhooks: one delivery per live webhook that takes this event type, written
    // with the event (the rule: tb_core::outbox). The event id stands in the receipt column, so
    // (event, webhook) is unique.
    let hooks = c.rows(
        "SELECT id, events FROM webhooks WHERE deleted = 0",
        p![],
        |r| {
            Ok(outbox::LiveWebhook {
                id: r.get(0)?,
                events: serde_json::from_str(&r.get::<String>(1)?).unwrap_or_default(),
            })
        },
    )?;
    for o in outbox::fan_out(&hooks, run, event_id, ty, now) {
        c.exec(
            "INSERT INTO deliveries (id, receipt_id, subscription_id, binding_id, dedup_key, action, workflow_id, run_id, \
               inputs, state, due_at, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?3, ?2, 'webhook', NULL, ?4, '{}', 'pending', ?5, ?5, ?5)",
            p![o.id, o.event_id, o.webhook_id, o.run_id, o.due_at],
        )?;
    }
    Ok(())
}

/// Persists a subscription transition and its `state.changed` event; `cause` is the delivery whose
/// attempt caused it (so a dead-letter record can show the state change it caused).
fn apply_transition(
    c: &dyn Db,
    sub: &SubscriptionRecord,
    t: &Transition,
    cause: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "UPDATE subscriptions SET state = ?2, updated_at = ?3, state_changed_at = ?3 WHERE id = ?1",
        p![sub.id, t.to.as_str(), now],
    )?;
    let payload = serde_json::to_value(SubscriptionStateChanged {
        subscription_id: sub.id.clone(),
        source: sub.source.as_str().to_string(),
        from_state: t.from,
        to_state: t.to,
        reason: t.reason,
    })
    .expect("serializable");
    insert_sub_event(
        c,
        &sub.id,
        events::SUBSCRIPTION_STATE_CHANGED,
        &payload,
        cause,
        &new_id(IdKind::Event),
        now,
    )
}

pub(crate) fn apply_subscription_input(
    c: &dyn Db,
    id: &str,
    input: SubscriptionInput,
    now: i64,
) -> StoreResult<Option<Transition>> {
    let sub = read::get_subscription(c, id)?;
    let t = transition(sub.state, input);
    if let Some(t) = &t {
        apply_transition(c, &sub, t, None, now)?;
        if t.to == SubscriptionState::Active {
            c.exec(
                "UPDATE subscriptions SET consecutive_failures = 0, first_failure_at = NULL WHERE id = ?1",
                p![id],
            )?;
        }
    }
    Ok(t)
}

pub(crate) fn commit_attempt(c: &dyn Db, a: &AttemptCommit) -> StoreResult<AttemptCommitted> {
    let d = read::lock_delivery(c, &a.delivery_id)?;
    let owner: Option<String> = c
        .row(
            "SELECT lease_owner FROM deliveries WHERE id = ?1",
            p![&a.delivery_id],
            |r| r.get(0),
        )?
        .ok_or_else(no_row)?;
    if d.state.is_terminal()
        || owner.as_deref() != Some(a.lease_owner.as_str())
        || d.attempts + 1 != a.attempt.attempt
    {
        return Err(StoreError::LeaseLost(a.delivery_id.clone()));
    }
    let at = &a.attempt;
    // A local effect (session start with coalescing, signal, prompt) happens first: if it is refused,
    // this whole job rolls back and the worker records a failed attempt instead.
    let mut run_to_write = a.run.clone();
    let mut target = a.run.as_ref().map(|r| r.id.clone());
    let mut consumed = a.run.is_some() && at.outcome == AttemptOutcome::Delivered;
    if let Some(e) = &a.effect {
        let done = super::session::apply_effect(c, e, a.now)?;
        if let (true, crate::session::Effect::StartSession { run, .. }) = (done.start, e) {
            run_to_write = Some(run.clone());
        }
        target = Some(done.run_id);
        consumed = done.consumed;
    }
    c.exec(
        "INSERT INTO attempts (delivery_id, attempt, event_id, outcome, error_class, started_at, duration_ms, next_due_at, message) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)", p![
        a.delivery_id,
        at.attempt,
        at.event_id,
        at.outcome.as_str(),
        at.error_class,
        at.started_at,
        at.duration_ms as i64,
        at.next_due_at,
        at.message
    ])?;
    c.exec(
        "UPDATE deliveries SET state = ?2, attempts = ?3, due_at = ?4, lease_owner = NULL, lease_until = NULL, \
         first_attempt_at = COALESCE(first_attempt_at, ?5), last_error = ?6, dead_letter_reason = ?7, updated_at = ?8, \
         run_id = COALESCE(run_id, ?9), consumed_at = ?10 WHERE id = ?1", p![
        a.delivery_id,
        a.next_state.as_str(),
        at.attempt,
        at.next_due_at,
        at.started_at,
        at.error_class,
        a.dead_letter_reason,
        a.now,
        target.as_deref(),
        consumed.then_some(a.now)
    ])?;
    let run_id = target.clone();
    let attempted = serde_json::to_value(DeliveryAttempted {
        subscription_id: d.subscription_id.clone(),
        dedup_key: d.dedup_key.clone(),
        attempt: at.attempt,
        outcome: at.outcome,
        run_id: if at.outcome == AttemptOutcome::Delivered {
            run_id.clone()
        } else {
            None
        },
    })
    .expect("serializable");
    insert_sub_event(
        c,
        &d.subscription_id,
        events::DELIVERY_ATTEMPTED,
        &attempted,
        Some(&d.id),
        &at.event_id,
        a.now,
    )?;

    if let Some(run) = &run_to_write {
        insert_run(c, run, &d, &at.event_id, &attempted, a.now)?;
    }
    if a.next_state.is_terminal() {
        settle_receipt(c, &d.receipt_id, a.now)?;
    }

    // Subscription counters and state machine (the rules live in tb_core::subscription). Runs started
    // through the API (`POST /v1/runs`) belong to no trigger subscription: nothing to update.
    let policy = at.outcome != AttemptOutcome::Delivered
        && receipt::is_policy_refusal(at.error_class.as_deref());
    let sub = match read::get_subscription(c, &d.subscription_id) {
        Ok(_) if policy => {
            return Ok(AttemptCommitted {
                subscription_transition: None,
                run_id: target,
            })
        }
        Ok(s) => s,
        Err(StoreError::NotFound(_)) => {
            return Ok(AttemptCommitted {
                subscription_transition: None,
                run_id: target,
            })
        }
        Err(e) => return Err(e),
    };
    if at.outcome == AttemptOutcome::Delivered
        && sub.state == SubscriptionState::Active
        && !subscription::success_needs_write(
            sub.last_success_at,
            sub.consecutive_failures,
            sub.first_failure_at,
            a.now,
        )
    {
        // Nothing to change: the busy subscription's row is neither written nor locked.
        return Ok(AttemptCommitted {
            subscription_transition: None,
            run_id: target,
        });
    }
    // Counters and state are read, then rewritten: read them again under the row's lock.
    let sub = read::lock_subscription(c, &sub.id)?;
    // The store supplies the inputs (last success, failures since, first failure time); the rules
    // that judge them live in tb_core::subscription.
    let mut inputs = Vec::new();
    if at.outcome == AttemptOutcome::Delivered {
        inputs.push(SubscriptionInput::AttemptDelivered);
        c.exec(
            "UPDATE subscriptions SET consecutive_failures = 0, first_failure_at = NULL, last_success_at = ?2 WHERE id = ?1", p![sub.id, a.now])?;
    } else {
        let streak = FailureStreak::next(
            sub.last_success_at,
            sub.consecutive_failures,
            sub.first_failure_at,
            at.started_at,
        );
        inputs.push(SubscriptionInput::AttemptFailed {
            streak,
            threshold: sub.failure_threshold,
            policy: a.failure_policy,
        });
        if at.outcome == AttemptOutcome::DeadLettered {
            inputs.push(SubscriptionInput::DeliveryExhausted {
                streak,
                policy: a.failure_policy,
            });
        }
        let last_error = match (&at.error_class, &at.message) {
            (Some(class), Some(m)) => Some(format!("{class}: {m}")),
            (Some(class), None) => Some(class.clone()),
            (None, m) => m.clone(),
        };
        c.exec(
            "UPDATE subscriptions SET consecutive_failures = ?2, first_failure_at = ?3, last_error = ?4 WHERE id = ?1", p![
            sub.id,
            streak.failures_since,
            streak.first_failure_at,
            last_error
        ])?;
    }
    let mut state = sub.state;
    let mut last = None;
    for input in inputs {
        if let Some(t) = transition(state, input) {
            apply_transition(c, &sub, &t, Some(&d.id), a.now)?;
            state = t.to;
            last = Some(Transition {
                from: sub.state,
                ..t
            });
        }
    }
    Ok(AttemptCommitted {
        subscription_transition: last,
        run_id: target,
    })
}

/// Writes a started run: `run.started` (seq 0, causationId = the attempt's event), the delivered
/// `trigger.delivery.attempted` under its own event id (seq 1; spec notes §15), and the terminal event
/// when the run already ended (seq 2). A dead-lettered API run gets `run.dead_lettered` then `run.failed`.
fn insert_run(
    c: &dyn Db,
    run: &NewRun,
    d: &DeliveryRecord,
    causation: &str,
    attempted: &Value,
    now: i64,
) -> StoreResult<()> {
    let terminal = run.status.terminal_event();
    let next_seq = if terminal.is_some() { 3 } else { 2 };
    if let Some((reason, attempts)) = &run.dead_letter {
        // RFC 0053: the run never started; its log is the dead-lettering and the failure, last.
        insert_run_row(c, run, d, causation, 2, now)?;
        let dl = serde_json::json!({"runId": run.id, "reason": reason, "attempts": attempts});
        insert_run_event(
            c,
            &run.id,
            0,
            "run.dead_lettered",
            &dl,
            Some(causation),
            now,
        )?;
        let failed = serde_json::json!({"error": {"code": reason, "message": "the run could not be started; its retries are exhausted"}});
        return insert_run_event(c, &run.id, 1, "run.failed", &failed, None, now);
    }
    insert_run_row(c, run, d, causation, next_seq, now)?;
    let started = serde_json::to_value(RunStarted {
        workflow_id: run.workflow_id.clone(),
        inputs: run.inputs.clone(),
    })
    .expect("serializable");
    insert_run_event(
        c,
        &run.id,
        0,
        events::RUN_STARTED,
        &started,
        Some(causation),
        now,
    )?;
    insert_run_event_with_id(
        c,
        causation,
        &run.id,
        1,
        events::DELIVERY_ATTEMPTED,
        attempted,
        None,
        now,
    )?;
    if let Some(ty) = terminal {
        insert_run_event(c, &run.id, 2, ty, &serde_json::json!({}), None, now)?;
    }
    if let Some((content, mailbox)) = &run.session {
        super::session::start_session(c, &run.id, content, mailbox, now)?;
    }
    Ok(())
}

fn insert_run_row(
    c: &dyn Db,
    run: &NewRun,
    d: &DeliveryRecord,
    causation: &str,
    next_seq: u64,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "INSERT INTO runs (id, workflow_id, status, inputs, delivery_id, receipt_id, subscription_id, causation_id, \
         next_sequence, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)", p![
        run.id,
        run.workflow_id,
        run.status.as_str(),
        run.inputs.to_string(),
        d.id,
        d.receipt_id,
        d.subscription_id,
        causation,
        next_seq as i64,
        now
    ])?;
    Ok(())
}

pub(crate) fn settle_receipt(c: &dyn Db, receipt_id: &str, now: i64) -> StoreResult<()> {
    // Two deliveries of one receipt finishing at once on two replicas must not each see the other as
    // still open: lock the receipt, then read its deliveries (each statement sees what committed).
    c.query(
        &format!(
            "SELECT id FROM receipts WHERE id = ?1{}",
            c.dialect().for_update()
        ),
        p![receipt_id],
    )?;
    let rows = c.rows(
        "SELECT state, dead_letter_reason, consumed_at IS NOT NULL FROM deliveries WHERE receipt_id = ?1",
        p![receipt_id],
        |r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<Option<String>>(1)?,
                r.get::<bool>(2)?,
            ))
        },
    )?;
    let views: Vec<receipt::DeliveryView> = rows
        .iter()
        .map(|(s, reason, consumed)| receipt::DeliveryView {
            state: DeliveryState::parse(s).unwrap_or(DeliveryState::Pending),
            reason: reason.as_deref(),
            consumed: *consumed,
        })
        .collect();
    if let Some(settled) = receipt::settle(&views) {
        c.exec(
            "UPDATE receipts SET state = ?2, updated_at = ?3 WHERE id = ?1 AND state != 'expired'",
            p![receipt_id, settled.as_str(), now],
        )?;
    }
    Ok(())
}

pub(crate) fn finish_run(
    c: &dyn Db,
    run_id: &str,
    status: RunStatus,
    output: Option<&Value>,
    now: i64,
) -> StoreResult<RunRecord> {
    let Some(ty) = status.terminal_event() else {
        return Err(StoreError::Conflict(format!(
            "{} is not a terminal status",
            status.as_str()
        )));
    };
    let run = read::lock_run(c, run_id)?;
    if run.status.is_terminal() {
        return Err(StoreError::Conflict(format!(
            "the run is already {}",
            run.status.as_str()
        )));
    }
    // Stop / cancel wins the armed wait (DESIGN §4 Wait); its events come before the terminal one.
    super::session::on_run_end(c, run_id, now)?;
    let seq: i64 = c
        .row("UPDATE runs SET status = ?2, output = ?3, wait_reason = NULL, updated_at = ?4, next_sequence = next_sequence + 1 WHERE id = ?1 RETURNING next_sequence - 1", p![run_id, status.as_str(), output.map(|o| o.to_string()), now], |r| r.get(0))?
        .ok_or_else(|| StoreError::NotFound("run".into()))?;
    insert_run_event(c, run_id, seq as u64, ty, &serde_json::json!({}), None, now)?;
    read::get_run(c, run_id)
}

pub(crate) fn replay_delivery(c: &dyn Db, id: &str, now: i64) -> StoreResult<DeliveryRecord> {
    let d = read::get_delivery(c, id)?;
    if d.state != DeliveryState::DeadLettered {
        return Err(StoreError::Conflict(format!(
            "only dead-lettered deliveries can be replayed; this one is {}",
            d.state.as_str()
        )));
    }
    c.exec(
        "UPDATE deliveries SET state = 'pending', due_at = ?2, replays = replays + 1, dead_letter_reason = NULL, \
         lease_owner = NULL, lease_until = NULL, updated_at = ?2 WHERE id = ?1", p![id, now])?;
    c.exec(
        "UPDATE receipts SET state = 'routed', updated_at = ?2 WHERE id = ?1",
        p![d.receipt_id, now],
    )?;
    read::get_delivery(c, id)
}

/// A stored idempotency record: digest, state, status, content type, body, lease end.
type IdempotencyRow = (
    String,
    String,
    Option<u16>,
    Option<String>,
    Option<Vec<u8>>,
    i64,
);

/// 24 h: how long a final answer is replayed (OpenWOP Layer-1 floor).
const IDEMPOTENCY_TTL_MS: i64 = 86_400_000;

pub(crate) fn idempotency_claim(
    c: &dyn Db,
    scope: &str,
    key: &str,
    digest: &str,
    now: i64,
    lease_ms: u64,
) -> StoreResult<IdempotencyClaim> {
    c.exec(
        "DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND expires_at <= ?3",
        p![scope, key, now],
    )?;
    let lease = now + lease_ms as i64;
    let inserted = c.exec(
        "INSERT INTO idempotency_keys (scope, key, digest, state, lease_until, expires_at) \
             VALUES (?1, ?2, ?3, 'pending', ?4, ?5) ON CONFLICT (scope, key) DO NOTHING",
        p![scope, key, digest, lease, now + IDEMPOTENCY_TTL_MS],
    )?;
    if inserted == 1 {
        return Ok(IdempotencyClaim::New { lease_until: lease });
    }
    let (d, state, status, ct, body, lease_until): IdempotencyRow = c
        .row("SELECT digest, state, status, content_type, body, lease_until FROM idempotency_keys WHERE scope = ?1 AND key = ?2", p![scope, key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))?.ok_or_else(no_row)?;
    if d != digest {
        return Ok(IdempotencyClaim::Mismatch);
    }
    if state == "completed" {
        return Ok(IdempotencyClaim::Replay(StoredReply {
            status: status.unwrap_or(200),
            content_type: ct,
            body: body.unwrap_or_default(),
        }));
    }
    if lease_until > now {
        return Ok(IdempotencyClaim::InFlight {
            retry_after_ms: (lease_until - now) as u64,
        });
    }
    // The holder's lease lapsed (it crashed): take the claim over with a compare-and-set.
    let taken = c
        .exec("UPDATE idempotency_keys SET lease_until = ?4 WHERE scope = ?1 AND key = ?2 AND lease_until = ?3 AND state = 'pending'", p![scope, key, lease_until, lease])?;
    Ok(if taken == 1 {
        IdempotencyClaim::New { lease_until: lease }
    } else {
        IdempotencyClaim::InFlight {
            retry_after_ms: lease_ms,
        }
    })
}

pub(crate) fn idempotency_release(
    c: &dyn Db,
    scope: &str,
    key: &str,
    lease_until: i64,
) -> StoreResult<bool> {
    let n = c
        .exec(
            "DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND state = 'pending' AND lease_until = ?3", p![scope, key, lease_until])?;
    Ok(n == 1)
}

pub(crate) fn idempotency_finish(
    c: &dyn Db,
    scope: &str,
    key: &str,
    reply: Option<&StoredReply>,
    now: i64,
) -> StoreResult<()> {
    match reply {
        Some(r) => c.exec(
            "UPDATE idempotency_keys SET state = 'completed', status = ?3, content_type = ?4, body = ?5, expires_at = ?6 \
             WHERE scope = ?1 AND key = ?2",
            p![scope, key, r.status, r.content_type, r.body, now + IDEMPOTENCY_TTL_MS],
        ),
        None => c.exec(
            "DELETE FROM idempotency_keys WHERE scope = ?1 AND key = ?2 AND state = 'pending'",
            p![scope, key],
        ),
    }?;
    Ok(())
}

pub(crate) fn sweep(
    c: &dyn Db,
    now: i64,
    bodies_before: i64,
    dead_letters_before: i64,
    batch: u32,
    cursor: SweepCursor,
) -> StoreResult<SweepPage> {
    let batch = batch.max(1);
    let mut next = cursor;
    let mut counts = SweepCounts::default();
    if !next.bodies_done {
        // Walk the bodies that still exist (never the receipts whose body is already gone).
        let page: Vec<(String, String, i64)> = c
            .rows(
                "SELECT b.receipt_id, r.state, r.received_at FROM bodies b JOIN receipts r ON r.id = b.receipt_id \
                 WHERE b.receipt_id > ?1 ORDER BY b.receipt_id LIMIT ?2", p![next.bodies_after.as_deref().unwrap_or(""), batch], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        next.bodies_done = page.len() < batch as usize;
        for (id, state, received_at) in &page {
            if retention::body_walk_ends(*received_at, bodies_before) {
                next.bodies_done = true;
                break;
            }
            let due = ReceiptState::parse(state)
                .is_some_and(|s| retention::body_expired(s, *received_at, bodies_before));
            if due {
                counts.bodies += c.exec("DELETE FROM bodies WHERE receipt_id = ?1", p![id])? as u64;
            }
            next.bodies_after = Some(id.clone());
        }
    }
    if !next.dead_letters_done {
        let page: Vec<(String, String, i64)> = c
            .rows(
                "SELECT id, state, updated_at FROM deliveries WHERE state = 'dead-lettered' AND id > ?1 \
                 ORDER BY id LIMIT ?2", p![next.dead_letters_after.as_deref().unwrap_or(""), batch], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        for (id, state, updated_at) in &page {
            let due = DeliveryState::parse(state).is_some_and(|s| {
                retention::dead_letter_expired(s, *updated_at, dead_letters_before)
            });
            if !due {
                continue;
            }
            c.exec("DELETE FROM attempts WHERE delivery_id = ?1", p![id])?;
            counts.dead_letters += c.exec("DELETE FROM deliveries WHERE id = ?1", p![id])? as u64;
        }
        next.dead_letters_done = page.len() < batch as usize;
        next.dead_letters_after = page.last().map(|(id, _, _)| id.clone());
    }
    if !next.idempotency_done {
        // Deleted rows leave the candidate set, so "fewer than a batch" means none is left.
        counts.idempotency = c
            .exec("DELETE FROM idempotency_keys WHERE (scope, key) IN (SELECT scope, key FROM idempotency_keys WHERE expires_at <= ?1 LIMIT ?2)", p![now, batch])? as u64;
        next.idempotency_done = counts.idempotency < batch as u64;
    }
    if !next.signals_done {
        // Deleted rows leave the candidate set, so "fewer than a batch" means none is left.
        counts.signals = super::session::sweep_signals(c, bodies_before, batch)?;
        next.signals_done = counts.signals < batch as u64;
    }
    let complete =
        next.bodies_done && next.dead_letters_done && next.idempotency_done && next.signals_done;
    Ok(SweepPage {
        counts,
        next: (!complete).then_some(next),
    })
}

pub(crate) fn create_webhook(
    c: &dyn Db,
    w: &WebhookRecord,
    sub: &SubscriptionDef,
) -> StoreResult<()> {
    upsert_subscription(c, sub, w.created_at)?;
    c.exec(
        "INSERT INTO webhooks (id, url, events, tenant_id, secret_file, created_at, standard_secret_file) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)", p![
        w.id,
        w.url,
        serde_json::to_string(&w.events).expect("json"),
        w.tenant_id,
        w.secret_file,
        w.created_at,
        w.standard_secret_file
    ])?;
    Ok(())
}

pub(crate) fn delete_webhook(c: &dyn Db, id: &str, tenant: &str) -> StoreResult<()> {
    let n = c.exec(
        "UPDATE webhooks SET deleted = 1 WHERE id = ?1 AND tenant_id = ?2 AND deleted = 0",
        p![id, tenant],
    )?;
    if n == 0 {
        return Err(StoreError::NotFound("webhook".into()));
    }
    Ok(())
}

pub(crate) fn revoke_binding(
    c: &dyn Db,
    id: &str,
    by: Option<&str>,
    now: i64,
) -> StoreResult<bool> {
    let n = c.exec(
        "INSERT INTO binding_revocations (binding_id, revoked_at, revoked_by) VALUES (?1, ?2, ?3) \
             ON CONFLICT (binding_id) DO NOTHING",
        p![id, now, by],
    )?;
    Ok(n == 1)
}

pub(crate) fn restore_binding(c: &dyn Db, id: &str) -> StoreResult<bool> {
    let n = c.exec(
        "DELETE FROM binding_revocations WHERE binding_id = ?1",
        p![id],
    )?;
    Ok(n == 1)
}

pub(crate) fn add_duplicates(c: &dyn Db, counts: &[(String, u64, i64)]) -> StoreResult<()> {
    // The larger of two values: a scalar MAX() in SQLite, GREATEST() in PostgreSQL.
    let sql = match c.dialect() {
        Dialect::Sqlite => {
            "UPDATE receipts SET duplicates = duplicates + ?2, \
             last_duplicate_at = MAX(COALESCE(last_duplicate_at, 0), ?3) WHERE id = ?1"
        }
        Dialect::Postgres => {
            "UPDATE receipts SET duplicates = duplicates + ?2, \
             last_duplicate_at = GREATEST(COALESCE(last_duplicate_at, 0), ?3) WHERE id = ?1"
        }
    };
    for (id, n, at) in counts {
        c.exec(sql, p![id, *n as i64, at])?;
    }
    Ok(())
}
