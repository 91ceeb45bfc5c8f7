//! The commit of one delivery attempt: load what `tb_core::attempt::after_attempt` reads, under lock,
//! call it, write what it returned. Nothing is decided here.
//!
//! Locks, in this order (architecture §9): the delivery row (`FOR UPDATE`), the run a local effect acts
//! on (the session code locks it), the receipt row, then the subscription row, and that one only when
//! the rule writes it: a delivered attempt of an active subscription with no failure streak (and a
//! fresh enough `last_success_at`) neither locks nor writes it, so a busy subscription's attempts do not
//! queue behind one row. The subscription is first read without a lock; when the rule's answer writes
//! it, the row is locked, read again, and the rule asked again on what the lock holds.
//!
//! Statements. An attempt without a local effect loads the delivery, its receipt and the
//! subscription in ONE statement (`FOR UPDATE OF d, r` on PostgreSQL: the delivery's row, then the
//! receipt's, in that order; the subscription unlocked); an attempt with one locks the delivery alone,
//! applies the effect (which locks its run), then the receipt, so the order above holds either way. A
//! delivery without a receipt row (an outbound webhook's) takes the second path too. The receipt's other
//! deliveries are read in a later statement (READ COMMITTED: it sees a sibling's attempt that committed
//! while the receipt lock was awaited) and only when the receipt has more than one
//! (`receipts.deliveries`, written at commit; `NULL` on older receipts reads them). Whether the run to
//! start exists is not read first: the run row is inserted `ON CONFLICT (id) DO NOTHING`, and when it
//! existed the rule is asked again with `run_exists` (it then writes no run). The subscription events
//! go in one multi-row `INSERT`.
//!
//! Round trips on PostgreSQL (an attempt without a local effect, the common case): the `BEGIN`, the
//! joined load and the live outbound webhooks go out together; the run row alone (its answer decides);
//! every write after it as one [`Pipeline`]; then the `COMMIT`: four in all.

use crate::p;
use crate::sql::{Col, Db, Dialect, IdList, Pipeline, Row, Rows, ToParam, Value as SqlValue};
use serde_json::Value;
use std::sync::LazyLock;
use tb_core::attempt::{
    after_attempt, AttemptSnapshot, AttemptWrites, DeliveryRow, EffectDone, ReceiptRow, RunCreate,
    RunStart, SiblingDelivery, StreakUpdate, SubscriptionRow,
};
use tb_core::delivery::DeliveryState;
use tb_core::lease::{self, LeaseRow};
use tb_core::outbox;
use tb_core::receipt::ReceiptState;
use tb_core::signal::MailboxPolicy;

use super::lease::{lock_lease, lost};
use super::log::{live_webhooks, queue_attempts, queue_events, NewRunEvent, RunLog, LIVE_WEBHOOKS};
use super::read::{self, bad};
use crate::model::*;
use crate::session::Effect;
use crate::session::NewRun;
use crate::{StoreError, StoreResult};

/// Records attempt `a` (see [`AttemptCommit`]). Errors: `LeaseLost` (nothing committed, the caller
/// rolls back what was sent: another token,
/// a terminal delivery, an attempt already recorded, or the fenced update lost); `Rejected` when the
/// local effect is refused (the caller rolls everything back); `NotFound("delivery")`.
pub(crate) fn commit_attempt(c: &dyn Db, a: &AttemptCommit) -> StoreResult<AttemptCommitted> {
    let id = a.delivery_id.as_str();
    let joined = match a.effect {
        None => load_joined(c, id)?,
        Some(_) => None,
    };
    let (mut snapshot, filled, session, hooks) = match joined {
        Some((snapshot, hooks)) => {
            lease::accepts_completion(&snapshot.delivery.lease, &a.report.lease)
                .map_err(lost(id))?;
            (snapshot, None, None, hooks)
        }
        None => {
            let (d, lease_row) = lock_lease(c, id)?;
            // The lease is checked before a local effect runs: a stale holder must not raise a signal.
            lease::accepts_completion(&lease_row, &a.report.lease).map_err(lost(id))?;
            let (filled, session) = match &a.effect {
                Some(e) => {
                    let (done, session) = apply_effect(c, e, d.created_at, a.now)?;
                    let mut r = a.report.clone();
                    r.effect = Some(done);
                    (Some(r), session)
                }
                None => (None, None),
            };
            (load(c, &d, lease_row)?, filled, session, None)
        }
    };
    let report = filled.as_ref().unwrap_or(&a.report);
    let mut writes = after_attempt(&snapshot, report, a.now).map_err(lost(id))?;
    if writes.subscription.is_some() {
        // The rule writes the subscription: decide again on the row as its lock holds it.
        let sub = read::lock_subscription(c, &snapshot.delivery.subscription_id)?;
        snapshot.subscription = Some(subscription_row(&sub));
        writes = after_attempt(&snapshot, report, a.now).map_err(lost(id))?;
    }
    if let Some(run) = &writes.run {
        if !insert_run_row(c, run)? {
            // The run exists already (an API run's row, a session another attempt started): ask again.
            snapshot.run_exists = true;
            writes = after_attempt(&snapshot, report, a.now).map_err(lost(id))?;
        }
    }
    let receipt_id = snapshot.delivery.receipt_id.clone();
    apply(
        c,
        &writes,
        &receipt_id,
        &a.report.lease.token,
        session,
        hooks,
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
    accepted_at: i64,
    now: i64,
) -> StoreResult<(EffectDone, Option<(Value, MailboxPolicy)>)> {
    let done = super::session::apply_effect(c, e, accepted_at, now)?;
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

/// The delivery (as [`DELIVERY_COLS`](read::DELIVERY_COLS), then `lease_token`), its receipt's state and
/// delivery count, and the subscription ([`SUB_COLS`](read::SUB_COLS), all `NULL` without a row), in one
/// statement: on PostgreSQL `FOR UPDATE OF d, r` locks the delivery's row, then the receipt's.
const JOINED: &str = "SELECT d.id, d.receipt_id, d.subscription_id, d.binding_id, d.dedup_key, d.action, \
     d.workflow_id, d.run_id, d.inputs, d.state, d.attempts, d.due_at, d.lease_until, d.first_attempt_at, \
     d.last_error, d.dead_letter_reason, d.created_at, d.updated_at, d.lease_owner, d.replays, d.params, \
     d.consumed_at, d.kind, d.trace_context, d.lease_token, r.state, r.deliveries, s.id, s.source, s.connector, s.config, s.state, \
     s.failure_threshold, s.consecutive_failures, s.last_success_at, s.created_at, s.updated_at, \
     s.first_failure_at, s.state_changed_at, s.last_error \
     FROM deliveries d JOIN receipts r ON r.id = d.receipt_id \
     LEFT JOIN subscriptions s ON s.id = d.subscription_id WHERE d.id = ?1";
/// Where `lease_token` is in a [`JOINED`] row (right after the delivery's columns), where the receipt's
/// columns start, and the subscription's.
const JOINED_TOKEN: usize = read::DELIVERY_COLS_LEN;
const JOINED_RECEIPT: usize = JOINED_TOKEN + 1;
const JOINED_SUB: usize = JOINED_RECEIPT + 2;

/// The snapshot of an attempt without a local effect, loaded by [`JOINED`] (then the receipt's other
/// deliveries when it has several), with the live outbound webhooks a run it starts fans out to when
/// they came with the load ([`with_live_webhooks`]); `None` when no row came back: no such delivery, or
/// one without a receipt row (the caller takes the path of [`load`], which tells them apart).
fn load_joined(
    c: &dyn Db,
    id: &str,
) -> StoreResult<Option<(AttemptSnapshot, Option<Vec<outbox::LiveWebhook>>)>> {
    static LOCKED: LazyLock<String> = LazyLock::new(|| format!("{JOINED} FOR UPDATE OF d, r"));
    let sql = match c.dialect() {
        Dialect::Sqlite => JOINED,
        Dialect::Postgres => LOCKED.as_str(),
    };
    let (rows, hooks) = with_live_webhooks(c, sql, p![id])?;
    match rows.into_iter().next() {
        None => Ok(None),
        Some(row) => Ok(Some((snapshot_from_joined(c, row)?, hooks))),
    }
}

/// Runs the load `sql`; on PostgreSQL with the live outbound webhooks ([`LIVE_WEBHOOKS`]) in the same
/// round trip, which an attempt that starts a run fans out to. On SQLite (no network) they are not read
/// here: the run log reads them only when a run starts (`None`).
pub(crate) fn with_live_webhooks(
    c: &dyn Db,
    sql: &str,
    params: &[crate::sql::Param<'_>],
) -> StoreResult<(Vec<Row>, Option<Vec<outbox::LiveWebhook>>)> {
    if c.dialect() == Dialect::Sqlite {
        return Ok((c.query(sql, params)?, None));
    }
    let mut answers = c.query_many(&[(sql, params), (LIVE_WEBHOOKS, p![])])?;
    let hooks = live_webhooks(&answers.pop().unwrap_or_default())?;
    Ok((answers.pop().unwrap_or_default(), Some(hooks)))
}

/// [`JOINED`] for the deliveries `ids` (`d.id IN (?1, ..., ?n)` on SQLite, `d.id = ANY(?1::text[])` on
/// PostgreSQL: [`IdList`]), ordered by receipt then delivery id, so the locks (`FOR UPDATE OF d, r` on
/// PostgreSQL, taken in that order) are always taken in one global order
/// (`crate::sql::attempt_batch`). Binds `ids.params()`.
pub(crate) fn joined_many_sql(dialect: Dialect, ids: &IdList<'_>) -> String {
    let base = JOINED.replace(
        "WHERE d.id = ?1",
        &format!("WHERE {}", ids.condition("d.id")),
    );
    match dialect {
        Dialect::Sqlite => format!("{base} ORDER BY r.id, d.id"),
        Dialect::Postgres => format!("{base} ORDER BY r.id, d.id FOR UPDATE OF d, r"),
    }
}

/// The snapshot in one [`JOINED`] row (then the receipt's other deliveries when it has several).
pub(crate) fn snapshot_from_joined(c: &dyn Db, mut row: Row) -> StoreResult<AttemptSnapshot> {
    let sub = Row(row.0.split_off(JOINED_SUB));
    let d = read::delivery_row(&row)?;
    let lease_row = LeaseRow {
        state: d.state,
        attempts: d.attempts,
        token: row.get(JOINED_TOKEN)?,
        until: d.lease_until,
    };
    let state: String = row.get(JOINED_RECEIPT)?;
    let count: Option<i64> = row.get(JOINED_RECEIPT + 1)?;
    let receipt = receipt_row(c, &d, &state, count)?;
    let subscription = match sub.0.first() {
        None | Some(SqlValue::Null) => None,
        Some(_) => Some(subscription_row(&read::sub_row(&sub)?)),
    };
    Ok(snapshot(d, lease_row, Some(receipt), subscription))
}

/// The receipt row in the rule's terms: its `state`, and its other deliveries, read in a later statement
/// than its lock unless `count` (`receipts.deliveries`) says this delivery is its only one.
fn receipt_row(
    c: &dyn Db,
    d: &DeliveryRecord,
    state: &str,
    count: Option<i64>,
) -> StoreResult<ReceiptRow> {
    let others = match count {
        Some(1) => Vec::new(),
        _ => c.rows(
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
    };
    Ok(ReceiptRow {
        state: ReceiptState::parse(state).ok_or_else(|| bad("receipt state", state))?,
        others,
    })
}

/// Loads the snapshot after the delivery's lock (and a local effect): the receipt row (`FOR UPDATE`)
/// and then, when it has several deliveries, its other ones; the subscription unlocked. `run_exists`
/// is `false` until the run's insert says otherwise.
fn load(c: &dyn Db, d: &DeliveryRecord, lease: LeaseRow) -> StoreResult<AttemptSnapshot> {
    // An outbound webhook delivery references the run event it sends, not a receipt: no row then.
    let found = c.row(
        &format!(
            "SELECT state, deliveries FROM receipts WHERE id = ?1{}",
            c.dialect().for_update()
        ),
        p![d.receipt_id],
        |r| Ok((r.get::<String>(0)?, r.get::<Option<i64>>(1)?)),
    )?;
    let receipt = match found {
        None => None,
        Some((state, count)) => Some(receipt_row(c, d, &state, count)?),
    };
    // Runs started through `POST /v1/runs` (and capability signals) have no subscription row.
    let subscription = match read::get_subscription(c, &d.subscription_id) {
        Ok(s) => Some(subscription_row(&s)),
        Err(StoreError::NotFound { .. }) => None,
        Err(e) => return Err(e),
    };
    Ok(snapshot(d.clone(), lease, receipt, subscription))
}

fn snapshot(
    d: DeliveryRecord,
    lease: LeaseRow,
    receipt: Option<ReceiptRow>,
    subscription: Option<SubscriptionRow>,
) -> AttemptSnapshot {
    AttemptSnapshot {
        delivery: DeliveryRow {
            id: d.id,
            receipt_id: d.receipt_id,
            subscription_id: d.subscription_id,
            dedup_key: d.dedup_key,
            lease,
            run_id: d.run_id,
            first_attempt_at: d.first_attempt_at,
        },
        receipt,
        subscription,
        run_exists: false,
    }
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

/// Writes `w` (of an attempt on a delivery of receipt `receipt_id`) in the rule's order, as ONE
/// [`Pipeline`] (one round trip on PostgreSQL); a session the run starts is written after it. The
/// delivery's update is fenced on `token` and goes first: a lost race is `LeaseLost`, and the caller
/// rolls back what was sent after it. `hooks` are the live outbound webhooks when the load read them
/// (read here otherwise, when a run is started).
fn apply(
    c: &dyn Db,
    w: &AttemptWrites,
    receipt_id: &str,
    token: &str,
    session: Option<(Value, MailboxPolicy)>,
    hooks: Option<Vec<outbox::LiveWebhook>>,
    now: i64,
) -> StoreResult<()> {
    let u = &w.delivery;
    let mut q = Pipeline::new();
    let fence = q.push(
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
    );
    queue_attempts(&mut q, c.dialect(), &[&w.attempt])?;
    queue_events(&mut q, c.dialect(), &w.events)?;
    if let Some(run) = &w.run {
        // Its row is in already (`insert_run_row`, before these writes): its first events, packed.
        let events: Vec<NewRunEvent<'_>> = first_events(run).collect();
        let mut log = match hooks {
            Some(hooks) => RunLog::with_hooks(c, hooks),
            None => RunLog::new(c),
        };
        log.queue_first_events(&mut q, &[&events])?;
    }
    if let Some(state) = w.receipt_state {
        q.push(
            "UPDATE receipts SET state = ?2, updated_at = ?3 WHERE id = ?1",
            p![receipt_id, state.as_str(), now],
        );
    }
    if let Some(s) = &w.subscription {
        match &s.streak {
            StreakUpdate::Reset { last_success_at } => q.push(
                "UPDATE subscriptions SET consecutive_failures = 0, first_failure_at = NULL, \
                 last_success_at = ?2 WHERE id = ?1",
                p![s.id, last_success_at],
            ),
            StreakUpdate::Failed {
                consecutive_failures,
                first_failure_at,
                last_error,
            } => q.push(
                "UPDATE subscriptions SET consecutive_failures = ?2, first_failure_at = ?3, \
                 last_error = ?4 WHERE id = ?1",
                p![s.id, consecutive_failures, first_failure_at, last_error],
            ),
        };
        if let Some(state) = s.state {
            q.push(
                "UPDATE subscriptions SET state = ?2, updated_at = ?3, state_changed_at = ?3 WHERE id = ?1",
                p![s.id, state.as_str(), now],
            );
        }
    }
    let counts = q.send(c)?;
    lease::fenced(counts[fence]).map_err(lost(&w.attempt.delivery_id))?;
    if let (Some(run), Some((content, mailbox))) = (&w.run, &session) {
        if run.start_session {
            super::session::start_session(c, &run.id, content, mailbox, now)?;
        }
    }
    Ok(())
}

/// Inserts the run row unless a run with its id exists (`ON CONFLICT (id) DO NOTHING`); `false` when it
/// existed, and nothing was written.
fn insert_run_row(c: &dyn Db, r: &RunCreate) -> StoreResult<bool> {
    Ok(!insert_run_rows(c, &[r])?.is_empty())
}

/// Inserts the run rows whose ids do not exist yet, in one statement; the ids inserted.
pub(crate) fn insert_run_rows(c: &dyn Db, runs: &[&RunCreate]) -> StoreResult<Vec<String>> {
    use Col::{Int, Text};
    const COLS: &[Col] = &[
        Text, Text, Text, Text, Text, Text, Text, Text, Int, Int, Int,
    ];
    let inputs: Vec<String> = runs.iter().map(|r| r.inputs.to_string()).collect();
    let mut rows = Rows::new(c.dialect(), COLS);
    for (r, inputs) in runs.iter().zip(&inputs) {
        rows.push(&[
            r.id.to_param(),
            r.workflow_id.to_param(),
            r.status.as_str().to_param(),
            inputs.to_param(),
            r.delivery_id.to_param(),
            r.receipt_id.to_param(),
            r.subscription_id.to_param(),
            r.causation_id.to_param(),
            r.next_sequence.to_param(),
            r.created_at.to_param(),
            r.created_at.to_param(),
        ]);
    }
    let sql = format!(
        "INSERT INTO runs (id, workflow_id, status, inputs, delivery_id, receipt_id, subscription_id, \
         causation_id, next_sequence, created_at, updated_at) {} ON CONFLICT (id) DO NOTHING RETURNING id",
        rows.values()
    );
    c.query(&sql, &rows.params()?)?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect()
}

/// A new run's first events, as the run log appends them (at the run's creation time).
pub(crate) fn first_events(r: &RunCreate) -> impl Iterator<Item = NewRunEvent<'_>> {
    r.events.iter().map(move |e| NewRunEvent {
        event_id: &e.event_id,
        run_id: &r.id,
        sequence: e.sequence,
        event_type: e.event_type,
        payload: &e.payload,
        causation_id: e.causation_id.as_deref(),
        at: r.created_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_joined_load_selects_the_delivery_columns_in_their_order() {
        let cols: Vec<String> = read::DELIVERY_COLS
            .split(", ")
            .map(|c| format!("d.{c}"))
            .collect();
        assert_eq!(cols.len(), read::DELIVERY_COLS_LEN);
        let selected = JOINED.trim_start_matches("SELECT ");
        let prefix = format!(
            "{}, d.lease_token, r.state, r.deliveries, s.id,",
            cols.join(", ")
        );
        let squashed: String = selected.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(squashed.starts_with(&prefix), "{squashed}");
    }
}
