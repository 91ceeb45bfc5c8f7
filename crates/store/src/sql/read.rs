//! Row mapping and read queries of the SQLite backend.

use crate::p;
use crate::sql::{Db, Param, Row, ToParam};
use serde_json::Value;
use tb_core::delivery::{AttemptOutcome, DeliveryKind, DeliveryState};
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::run::RunStatus;
use tb_core::subscription::{Source, SubscriptionState};

use crate::model::*;
use crate::{RecordKind, StoreError, StoreResult};

pub(crate) fn json(s: String) -> Value {
    serde_json::from_str(&s).unwrap_or(Value::Null)
}

/// A stored value no rule knows (a schema or data bug): reported, never guessed.
pub(crate) fn bad(what: &str, v: &str) -> StoreError {
    StoreError::Database(format!("bad {what} in the store: {v}"))
}

/// A query that must return a row returned none (a schema or data bug).
pub(crate) fn no_row() -> StoreError {
    StoreError::Database("the query returned no row".into())
}

pub(crate) const SUB_COLS: &str = "id, source, connector, config, state, failure_threshold, consecutive_failures, last_success_at, created_at, updated_at, first_failure_at, state_changed_at, last_error";

pub(crate) fn sub_row(r: &Row) -> StoreResult<SubscriptionRecord> {
    let source: String = r.get(1)?;
    let state: String = r.get(4)?;
    Ok(SubscriptionRecord {
        id: r.get(0)?,
        source: serde_json::from_value(Value::String(source.clone()))
            .map_err(|_| bad("source", &source))?,
        connector: r.get(2)?,
        config: json(r.get(3)?),
        state: SubscriptionState::parse(&state).ok_or_else(|| bad("state", &state))?,
        failure_threshold: r.get(5)?,
        consecutive_failures: r.get(6)?,
        last_success_at: r.get(7)?,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
        first_failure_at: r.get(10)?,
        state_since: r.get::<Option<i64>>(11)?.map_or_else(|| r.get(8), Ok)?,
        last_error: r.get(12)?,
    })
}

pub(crate) fn source_str(s: Source) -> &'static str {
    s.as_str()
}

pub(crate) const RECEIPT_COLS: &str = "id, subscription_id, dedup_key, provider_event_id, event_type, normalized, state, content_type, body_bytes, received_at, updated_at, duplicates, last_duplicate_at, source";

fn receipt_row(r: &Row) -> StoreResult<ReceiptRecord> {
    let state: String = r.get(6)?;
    let source: String = r.get(13)?;
    Ok(ReceiptRecord {
        id: r.get(0)?,
        source: ReceiptSource::parse(&source).ok_or_else(|| bad("receipt source", &source))?,
        subscription_id: r.get(1)?,
        dedup_key: r.get(2)?,
        provider_event_id: r.get(3)?,
        event_type: r.get(4)?,
        normalized: json(r.get(5)?),
        state: ReceiptState::parse(&state).ok_or_else(|| bad("receipt state", &state))?,
        content_type: r.get(7)?,
        body_bytes: r.get(8)?,
        received_at: r.get(9)?,
        updated_at: r.get(10)?,
        duplicates: r.get(11)?,
        last_duplicate_at: r.get(12)?,
    })
}

pub(crate) fn revoked_bindings(c: &dyn Db) -> StoreResult<Vec<(String, i64)>> {
    c.rows(
        "SELECT binding_id, revoked_at FROM binding_revocations ORDER BY binding_id",
        p![],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

pub(crate) const DELIVERY_COLS: &str = "id, receipt_id, subscription_id, binding_id, dedup_key, action, workflow_id, run_id, inputs, state, attempts, due_at, lease_until, first_attempt_at, last_error, dead_letter_reason, created_at, updated_at, lease_owner, replays, params, consumed_at, kind, trace_context";

/// Columns in [`DELIVERY_COLS`]: a query selecting more after them reads those from this index on.
pub(crate) const DELIVERY_COLS_LEN: usize = 24;

pub(crate) fn delivery_row(r: &Row) -> StoreResult<DeliveryRecord> {
    let state: String = r.get(9)?;
    let kind: String = r.get(22)?;
    Ok(DeliveryRecord {
        id: r.get(0)?,
        kind: DeliveryKind::parse(&kind).ok_or_else(|| bad("delivery kind", &kind))?,
        receipt_id: r.get(1)?,
        subscription_id: r.get(2)?,
        binding_id: r.get(3)?,
        dedup_key: r.get(4)?,
        action: r.get(5)?,
        workflow_id: r.get(6)?,
        run_id: r.get(7)?,
        inputs: json(r.get(8)?),
        state: DeliveryState::parse(&state).ok_or_else(|| bad("delivery state", &state))?,
        attempts: r.get(10)?,
        replays: r.get(19)?,
        due_at: r.get(11)?,
        lease_until: r.get(12)?,
        lease_owner: r.get(18)?,
        first_attempt_at: r.get(13)?,
        last_error: r.get(14)?,
        dead_letter_reason: r.get(15)?,
        created_at: r.get(16)?,
        updated_at: r.get(17)?,
        params: r.get::<Option<String>>(20)?.map(json),
        consumed_at: r.get(21)?,
        trace_context: r.get(23)?,
    })
}

const RUN_COLS: &str = "id, workflow_id, status, inputs, output, delivery_id, receipt_id, subscription_id, causation_id, created_at, updated_at, wait_reason";

pub(crate) fn run_row(r: &Row) -> StoreResult<RunRecord> {
    let status: String = r.get(2)?;
    let output: Option<String> = r.get(4)?;
    Ok(RunRecord {
        id: r.get(0)?,
        workflow_id: r.get(1)?,
        status: RunStatus::parse(&status).ok_or_else(|| bad("run status", &status))?,
        inputs: json(r.get(3)?),
        output: output.map(json),
        delivery_id: r.get(5)?,
        receipt_id: r.get(6)?,
        subscription_id: r.get(7)?,
        causation_id: r.get(8)?,
        created_at: r.get(9)?,
        updated_at: r.get(10)?,
        wait_reason: r.get(11)?,
    })
}

fn attempt_row(r: &Row) -> StoreResult<AttemptRecord> {
    let outcome: String = r.get(3)?;
    Ok(AttemptRecord {
        delivery_id: r.get(0)?,
        attempt: r.get(1)?,
        event_id: r.get(2)?,
        outcome: serde_json::from_value::<AttemptOutcome>(Value::String(outcome.clone()))
            .map_err(|_| bad("outcome", &outcome))?,
        error_class: r.get(4)?,
        started_at: r.get(5)?,
        duration_ms: r.get(6)?,
        next_due_at: r.get(7)?,
        message: r.get(8)?,
    })
}

pub(crate) fn get_subscription(c: &dyn Db, id: &str) -> StoreResult<SubscriptionRecord> {
    by_id(
        c,
        SUB_COLS,
        "subscriptions",
        id,
        sub_row,
        RecordKind::Subscription,
        false,
    )
}

/// The subscription, its row locked until the transaction ends (`FOR UPDATE` on PostgreSQL): taken
/// before its counters or state are read to be rewritten. Errors: `NotFound("subscription")`.
pub(crate) fn lock_subscription(c: &dyn Db, id: &str) -> StoreResult<SubscriptionRecord> {
    by_id(
        c,
        SUB_COLS,
        "subscriptions",
        id,
        sub_row,
        RecordKind::Subscription,
        true,
    )
}

/// The delivery, its row locked until the transaction ends (`FOR UPDATE` on PostgreSQL): an attempt's
/// commit, a replay and a lease renewal decide from its state and lease. Errors: `NotFound("delivery")`.
pub(crate) fn lock_delivery(c: &dyn Db, id: &str) -> StoreResult<DeliveryRecord> {
    by_id(
        c,
        DELIVERY_COLS,
        "deliveries",
        id,
        delivery_row,
        RecordKind::Delivery,
        true,
    )
}

pub(crate) fn subscriptions_in_state(
    c: &dyn Db,
    state: SubscriptionState,
) -> StoreResult<Vec<SubscriptionRecord>> {
    c.rows(
        &format!("SELECT {SUB_COLS} FROM subscriptions WHERE state = ?1 ORDER BY id"),
        p![state.as_str()],
        sub_row,
    )
}

pub(crate) fn list_subscriptions(c: &dyn Db) -> StoreResult<Vec<SubscriptionRecord>> {
    c.rows(
        &format!("SELECT {SUB_COLS} FROM subscriptions ORDER BY id"),
        p![],
        sub_row,
    )
}

/// The receipt holding `(subscription, dedup_key)` within its dedup window at `now`, and its
/// deliveries, as a `Duplicate` outcome.
pub(crate) fn duplicate_of(
    c: &dyn Db,
    sub: &str,
    key: &str,
    now: i64,
) -> StoreResult<Option<IngestOutcome>> {
    let id: Option<String> = c.row(
        "SELECT id FROM receipts WHERE subscription_id = ?1 AND dedup_key = ?2 \
             AND dedup_live = 1 AND dedup_until > ?3",
        p![sub, key, now],
        |r| r.get(0),
    )?;
    let Some(receipt_id) = id else {
        return Ok(None);
    };
    let deliveries = delivery_refs(c, &receipt_id)?;
    Ok(Some(IngestOutcome::Duplicate {
        receipt_id,
        deliveries,
    }))
}

fn delivery_refs(c: &dyn Db, receipt_id: &str) -> StoreResult<Vec<DeliveryRef>> {
    c.rows(
        "SELECT id, binding_id, CASE WHEN state = 'dead-lettered' THEN NULL ELSE run_id END \
             FROM deliveries WHERE receipt_id = ?1 ORDER BY binding_id",
        p![receipt_id],
        |r| {
            Ok(DeliveryRef {
                delivery_id: r.get(0)?,
                binding_id: r.get(1)?,
                run_id: r.get(2)?,
            })
        },
    )
}

/// The row of `table` whose `id` is `id`, or `NotFound(what)`; with `lock`, locked until the
/// transaction ends (`Dialect::for_update`).
fn by_id<T>(
    c: &dyn Db,
    cols: &str,
    table: &str,
    id: &str,
    map: fn(&Row) -> StoreResult<T>,
    what: RecordKind,
    lock: bool,
) -> StoreResult<T> {
    let suffix = if lock { c.dialect().for_update() } else { "" };
    one(
        c,
        &format!("SELECT {cols} FROM {table} WHERE id = ?1{suffix}"),
        id,
        map,
        what,
    )
}

/// One row by a single key, or `NotFound(what)`.
fn one<T>(
    c: &dyn Db,
    sql: &str,
    key: &str,
    map: fn(&Row) -> StoreResult<T>,
    what: RecordKind,
) -> StoreResult<T> {
    c.row(sql, p![key], map)?
        .ok_or_else(|| StoreError::not_found(what))
}

/// A newest-first page of a table (see [`list_sql`]).
fn page<T>(
    c: &dyn Db,
    cols: &str,
    table: &str,
    q: &ListQuery,
    map: fn(&Row) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    let (sql, args) = list_sql(cols, table, q, true);
    let params: Vec<Param<'_>> = args.iter().map(|a| a.to_param()).collect();
    c.rows(&sql, &params, map)
}

pub(crate) fn get_receipt(c: &dyn Db, id: &str) -> StoreResult<ReceiptRecord> {
    one(
        c,
        &format!("SELECT {RECEIPT_COLS} FROM receipts WHERE id = ?1"),
        id,
        receipt_row,
        RecordKind::Receipt,
    )
}

/// Builds `WHERE` clauses for a newest-first list on a table whose ids are time-ordered.
fn list_sql(cols: &str, table: &str, q: &ListQuery, state_col: bool) -> (String, Vec<String>) {
    let mut sql = format!("SELECT {cols} FROM {table} WHERE 1=1");
    let mut args = Vec::new();
    if let Some(b) = &q.before {
        args.push(b.clone());
        sql.push_str(&format!(" AND id < ?{}", args.len()));
    }
    if let (Some(s), true) = (&q.state, state_col) {
        args.push(s.clone());
        sql.push_str(&format!(
            " AND {} = ?{}",
            if table == "runs" { "status" } else { "state" },
            args.len()
        ));
    }
    if let Some(s) = &q.subscription_id {
        args.push(s.clone());
        sql.push_str(&format!(" AND subscription_id = ?{}", args.len()));
    }
    if let Some(f) = &q.from_id {
        args.push(f.clone());
        sql.push_str(&format!(" AND id >= ?{}", args.len()));
    }
    if let (Some(p), "receipts") = (&q.provider_event_id, table) {
        args.push(p.clone());
        sql.push_str(&format!(" AND provider_event_id = ?{}", args.len()));
    }
    if let (Some(w), "runs") = (&q.workflow_id, table) {
        args.push(w.clone());
        sql.push_str(&format!(" AND workflow_id = ?{}", args.len()));
    }
    sql.push_str(&format!(
        " ORDER BY id DESC LIMIT {}",
        q.limit.clamp(1, 1000)
    ));
    (sql, args)
}

pub(crate) fn list_receipts(c: &dyn Db, q: &ListQuery) -> StoreResult<Vec<ReceiptRecord>> {
    page(c, RECEIPT_COLS, "receipts", q, receipt_row)
}

/// The raw body of a receipt (its `body` column). An empty body is stored as `NULL`
/// (`write::receipt_params`): a receipt of 0 bytes reads as empty. Errors: `NotFound("receipt body")`
/// (no such receipt, or its body expired: the sweeper set it to `NULL`).
pub(crate) fn get_body(c: &dyn Db, receipt_id: &str) -> StoreResult<Vec<u8>> {
    c.row(
        "SELECT body, body_bytes FROM receipts WHERE id = ?1",
        p![receipt_id],
        |r| Ok((r.get::<Option<Vec<u8>>>(0)?, r.get::<i64>(1)?)),
    )?
    .and_then(|(body, len)| body.or((len == 0).then(Vec::new)))
    .ok_or_else(|| StoreError::not_found(RecordKind::ReceiptBody))
}

pub(crate) fn get_delivery(c: &dyn Db, id: &str) -> StoreResult<DeliveryRecord> {
    by_id(
        c,
        DELIVERY_COLS,
        "deliveries",
        id,
        delivery_row,
        RecordKind::Delivery,
        false,
    )
}

pub(crate) fn list_deliveries(c: &dyn Db, q: &ListQuery) -> StoreResult<Vec<DeliveryRecord>> {
    page(c, DELIVERY_COLS, "deliveries", q, delivery_row)
}

pub(crate) fn deliveries_of_receipt(
    c: &dyn Db,
    receipt_id: &str,
) -> StoreResult<Vec<DeliveryRecord>> {
    c.rows(
        &format!(
            "SELECT {DELIVERY_COLS} FROM deliveries WHERE receipt_id = ?1 ORDER BY binding_id"
        ),
        p![receipt_id],
        delivery_row,
    )
}

pub(crate) fn attempts(c: &dyn Db, delivery_id: &str) -> StoreResult<Vec<AttemptRecord>> {
    c.rows(
            "SELECT delivery_id, attempt, event_id, outcome, error_class, started_at, duration_ms, next_due_at, message \
             FROM attempts WHERE delivery_id = ?1 ORDER BY attempt", p![delivery_id], attempt_row)
}

pub(crate) fn get_run(c: &dyn Db, id: &str) -> StoreResult<RunRecord> {
    by_id(c, RUN_COLS, "runs", id, run_row, RecordKind::Run, false)
}

/// The run, its row locked until the transaction ends (`FOR UPDATE` on PostgreSQL; SQLite's one writer
/// already serializes). Every write that reads a run's state to decide (a signal raise, a wait step, a
/// turn claim or ack, the run's end) takes this lock first, so two replicas acting on one run serialize
/// and each decides from the other's committed result. Errors: `NotFound("run")`.
pub(crate) fn lock_run(c: &dyn Db, id: &str) -> StoreResult<RunRecord> {
    by_id(c, RUN_COLS, "runs", id, run_row, RecordKind::Run, true)
}

pub(crate) fn list_runs(c: &dyn Db, q: &ListQuery) -> StoreResult<Vec<RunRecord>> {
    page(c, RUN_COLS, "runs", q, run_row)
}

/// A run's events after sequence `after` (all when `None`), at most `limit` (1..=10 000), with their
/// payloads as built (`tb_core::events::shown_payload`: the fields the run row holds put back; the
/// run row is read once, only when an event needs it). A packed row (a new run's first events,
/// [`packed_events`](super::packed_events)) sits at the last sequence it covers and holds at least one
/// event after `after` when the query returns it, so `limit` rows hold at least `limit` events: they
/// are expanded, those at or before `after` dropped, and the rest cut to `limit`.
pub(crate) fn run_events(
    c: &dyn Db,
    run_id: &str,
    after: Option<u64>,
    limit: u32,
) -> StoreResult<Vec<RunEventRecord>> {
    let limit = limit.clamp(1, 10_000);
    let rows = c.rows(
        &format!("SELECT {RUN_EVENT_COLS} FROM run_events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3"),
        p![run_id, after.map(|a| a as i64).unwrap_or(-1), limit],
        run_event_row,
    )?;
    let mut events = Vec::with_capacity(rows.len());
    for r in rows {
        events.extend(
            super::packed_events::expand(r)?
                .into_iter()
                .filter(|e| after.is_none_or(|a| e.sequence > a)),
        );
    }
    events.truncate(limit as usize);
    let mut run_row = None;
    for e in &mut events {
        shown(c, e, &mut run_row)?;
    }
    Ok(events)
}

const RUN_EVENT_COLS: &str = "run_id, sequence, event_id, type, payload, causation_id, timestamp";

fn run_event_row(r: &Row) -> StoreResult<RunEventRecord> {
    Ok(RunEventRecord {
        run_id: r.get(0)?,
        sequence: r.get(1)?,
        event_id: r.get(2)?,
        event_type: r.get(3)?,
        payload: json(r.get(4)?),
        causation_id: r.get(5)?,
        timestamp: r.get(6)?,
    })
}

/// Puts back what `e`'s stored payload left to its run row (`tb_core::events::shown_payload`);
/// `run_row` caches the run's `(workflow_id, inputs)` across the events of one run.
fn shown(
    c: &dyn Db,
    e: &mut RunEventRecord,
    run_row: &mut Option<(String, Value)>,
) -> StoreResult<()> {
    if run_row.is_none() && tb_core::events::needs_run_row(&e.event_type, &e.payload) {
        *run_row = c.row(
            "SELECT workflow_id, inputs FROM runs WHERE id = ?1",
            p![e.run_id],
            |r| Ok((r.get::<String>(0)?, json(r.get(1)?))),
        )?;
    }
    let stored = std::mem::take(&mut e.payload);
    e.payload = tb_core::events::shown_payload(
        &e.event_type,
        &e.run_id,
        run_row.as_ref().map(|(w, i)| (w.as_str(), i)),
        stored,
    );
    Ok(())
}

pub(crate) fn subscription_events(
    c: &dyn Db,
    sub: &str,
    limit: u32,
) -> StoreResult<Vec<SubscriptionEventRecord>> {
    c.rows(
            "SELECT event_id, subscription_id, type, payload, delivery_id, timestamp FROM subscription_events \
             WHERE subscription_id = ?1 ORDER BY timestamp, event_id LIMIT ?2", p![sub, limit.clamp(1, 10_000)], |r| {
            Ok(SubscriptionEventRecord {
                event_id: r.get(0)?,
                subscription_id: r.get(1)?,
                event_type: r.get(2)?,
                payload: json(r.get(3)?),
                delivery_id: r.get(4)?,
                timestamp: r.get(5)?,
            })
        })
}

pub(crate) fn queue_depth(c: &dyn Db) -> StoreResult<QueueDepth> {
    let rows = c.rows(
        "SELECT state, COUNT(*) FROM deliveries WHERE state IN ('pending','retrying','dead-lettered') GROUP BY state",
        p![],
        |r| Ok((r.get::<String>(0)?, r.get::<u64>(1)?)),
    )?;
    let mut d = QueueDepth::default();
    for (s, n) in rows {
        match s.as_str() {
            "pending" => d.pending = n,
            "retrying" => d.retrying = n,
            _ => d.dead_lettered = n,
        }
    }
    Ok(d)
}

pub(crate) fn next_due_at(c: &dyn Db) -> StoreResult<Option<i64>> {
    // `INDEXED BY` is a SQLite planner hint (the PostgreSQL adapter drops it, see `sql::to_postgres`).
    Ok(c
        .value::<Option<i64>>(
            "SELECT MIN(due_at) FROM deliveries INDEXED BY deliveries_due WHERE state IN ('pending','retrying')",
            p![],
        )?
        .flatten())
}

/// Dead-lettered deliveries of a subscription, newest first (by `(updated_at, id)`), with their last
/// attempt and the state change that attempt caused, if any. Only records dead-lettered at or after
/// `q.not_before` (retention).
pub(crate) fn dead_letters(c: &dyn Db, q: &DeadLetterQuery) -> StoreResult<Vec<DeadLetterRecord>> {
    let (bt, bid) = q.before.clone().unwrap_or((i64::MAX, String::new()));
    let sql = "SELECT d.id, d.subscription_id, d.dedup_key, d.attempts, a.event_id, d.dead_letter_reason, d.updated_at, \
               (SELECT e.payload FROM subscription_events e WHERE e.delivery_id = d.id \
                  AND e.type = 'trigger.subscription.state.changed' ORDER BY e.timestamp DESC LIMIT 1) \
             FROM deliveries d JOIN attempts a ON a.delivery_id = d.id AND a.attempt = d.attempts \
             WHERE d.subscription_id = ?1 AND d.state = 'dead-lettered' AND d.updated_at >= ?2 \
               AND (d.updated_at < ?3 OR (d.updated_at = ?3 AND d.id < ?4)) \
             ORDER BY d.updated_at DESC, d.id DESC LIMIT ?5";
    let before_id = if q.before.is_some() {
        bid
    } else {
        "\u{10FFFF}".to_string()
    };
    c.rows(
        sql,
        p![q.subscription_id, q.not_before, bt, before_id, q.limit],
        |r| {
            let change: Option<String> = r.get(7)?;
            Ok(DeadLetterRecord {
                delivery_id: r.get(0)?,
                subscription_id: r.get(1)?,
                dedup_key: r.get(2)?,
                attempt: r.get(3)?,
                attempt_event_id: r.get(4)?,
                reason: r.get(5)?,
                dead_lettered_at: r.get(6)?,
                state_change: change.map(json),
            })
        },
    )
}

/// The dead letters a bulk replay selects: count and the first `q.limit` ids, oldest first, in one
/// statement (the window count and the ids come from the same snapshot). The filter is the last
/// attempt's error class and the dead-lettering time (`updated_at`), `from` inclusive, `to` exclusive.
/// An unset filter is `CAST(?N AS type) IS NULL`: PostgreSQL cannot infer the type of a parameter that
/// only meets `IS NULL`.
pub(crate) fn dead_letter_selection(
    c: &dyn Db,
    q: &DeadLetterSelect,
) -> StoreResult<DeadLetterSelection> {
    let rows = c.query(
        "SELECT d.id, COUNT(*) OVER () FROM deliveries d \
               JOIN attempts a ON a.delivery_id = d.id AND a.attempt = d.attempts \
             WHERE d.subscription_id = ?1 AND d.state = 'dead-lettered' AND d.updated_at >= ?2 \
               AND (CAST(?3 AS BIGINT) IS NULL OR d.updated_at >= ?3) \
               AND (CAST(?4 AS BIGINT) IS NULL OR d.updated_at < ?4) \
               AND (CAST(?5 AS TEXT) IS NULL OR a.error_class = ?5) \
             ORDER BY d.updated_at ASC, d.id ASC LIMIT ?6",
        p![
            q.subscription_id,
            q.not_before,
            q.from,
            q.to,
            q.error_class,
            q.limit
        ],
    )?;
    let mut out = DeadLetterSelection::default();
    for r in &rows {
        out.delivery_ids.push(r.get(0)?);
        out.count = r.get::<u64>(1)?;
    }
    Ok(out)
}

pub(crate) fn list_webhooks(c: &dyn Db) -> StoreResult<Vec<WebhookRecord>> {
    c.rows(
            "SELECT id, url, events, tenant_id, secret_file, created_at, standard_secret_file FROM webhooks \
             WHERE deleted = 0 ORDER BY id", p![], |r| {
            let events: String = r.get(2)?;
            Ok(WebhookRecord {
                id: r.get(0)?,
                url: r.get(1)?,
                events: serde_json::from_str(&events).unwrap_or_default(),
                tenant_id: r.get(3)?,
                secret_file: r.get(4)?,
                created_at: r.get(5)?,
                standard_secret_file: r.get(6)?,
            })
        })
}

/// Event `event_id` of run `run_id` (read through the log's primary key; event ids have no index of
/// their own), its payload as built. The run's rows are scanned for the event's own row or a packed
/// row ([`packed_events`](super::packed_events)), which is expanded to find it. Errors:
/// `NotFound("run event")`.
pub(crate) fn get_run_event(
    c: &dyn Db,
    run_id: &str,
    event_id: &str,
) -> StoreResult<RunEventRecord> {
    let rows = c.rows(
        &format!(
            "SELECT {RUN_EVENT_COLS} FROM run_events WHERE run_id = ?1 AND (event_id = ?2 OR type = ?3)"
        ),
        p![run_id, event_id, super::packed_events::PACKED],
        run_event_row,
    )?;
    let mut found = None;
    for r in rows {
        found = super::packed_events::expand(r)?
            .into_iter()
            .find(|e| e.event_id == event_id);
        if found.is_some() {
            break;
        }
    }
    let mut e = found.ok_or_else(|| StoreError::not_found(RecordKind::RunEvent))?;
    shown(c, &mut e, &mut None)?;
    Ok(e)
}

/// [`crate::Activity`] from `since` (ms) on: range scans over the time-ordered primary keys, grouped.
pub(crate) fn activity(c: &dyn Db, since: i64) -> StoreResult<crate::Activity> {
    let count = |r: &Row, i: usize| -> StoreResult<u64> { Ok(r.get::<i64>(i)?.max(0) as u64) };
    let receipts = c.rows(
        "SELECT subscription_id, state, (received_at - ?2) / 60000, COUNT(*) FROM receipts \
         WHERE id >= ?1 GROUP BY 1, 2, 3",
        p![
            tb_core::ids::floor(tb_core::ids::IdKind::Receipt, since).as_str(),
            since
        ],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, count(r, 3)?)),
    )?;
    let attempts = c.rows(
        "SELECT d.subscription_id, a.outcome, (a.started_at - ?2) / 60000, COUNT(*) FROM attempts a \
         JOIN deliveries d ON d.id = a.delivery_id WHERE a.event_id >= ?1 \
         GROUP BY 1, 2, 3",
        p![tb_core::ids::floor(tb_core::ids::IdKind::Event, since).as_str(), since],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, count(r, 3)?)),
    )?;
    let queue = queue_depth(c)?;
    let oldest_undelivered_at: Option<i64> = ["pending", "retrying"]
        .iter()
        .filter_map(|s| {
            c.value::<i64>(
                "SELECT created_at FROM deliveries WHERE state = ?1 ORDER BY id LIMIT 1",
                p![*s],
            )
            .ok()
            .flatten()
        })
        .min();
    let (waits_armed, next_deadline) = c
        .row(
            "SELECT COUNT(*), MIN(deadline) FROM waits WHERE state = 'armed'",
            p![],
            |r| Ok((count(r, 0)?, r.get::<Option<i64>>(1)?)),
        )?
        .unwrap_or((0, None));
    Ok(crate::Activity {
        receipts,
        attempts,
        queue,
        oldest_undelivered_at,
        waits_armed,
        next_deadline,
    })
}

/// The `ingress_counts` rows `q` selects, newest minute first, then by scope, key and outcome.
pub(crate) fn ingress_counts(c: &dyn Db, q: &IngressCountQuery) -> StoreResult<Vec<IngressCount>> {
    let limit = q.limit.clamp(1, 10_000);
    // Only the filters given: an untyped NULL parameter is an error on PostgreSQL.
    let scope = q.scope.as_deref().unwrap_or("");
    let key = q.key.as_deref().unwrap_or("");
    let sql = format!(
        "SELECT minute, scope, key, outcome, n FROM ingress_counts WHERE minute >= ?1{}{} \
         ORDER BY minute DESC, scope, key, outcome LIMIT ?4",
        if q.scope.is_some() {
            " AND scope = ?2"
        } else {
            " AND ?2 = ?2"
        },
        if q.key.is_some() {
            " AND key = ?3"
        } else {
            " AND ?3 = ?3"
        },
    );
    c.rows(&sql, p![q.since_minute, scope, key, limit], ingress_count)
}

/// An `ingress_counts` row selected as `minute, scope, key, outcome, n`.
fn ingress_count(r: &Row) -> StoreResult<IngressCount> {
    Ok(IngressCount {
        minute: r.get(0)?,
        scope: r.get(1)?,
        key: r.get(2)?,
        outcome: r.get(3)?,
        n: r.get::<i64>(4)?.max(0) as u64,
    })
}

/// The `admitted` rows of `minute` but `source`'s, at most 10 000.
pub(crate) fn admitted_totals(c: &dyn Db, minute: i64) -> StoreResult<Vec<IngressCount>> {
    c.rows(
        "SELECT minute, scope, key, outcome, n FROM ingress_counts \
         WHERE minute = ?1 AND outcome = 'admitted' AND scope <> 'source' LIMIT 10000",
        p![minute],
        ingress_count,
    )
}

/// Every quarantined subscription, by id.
pub(crate) fn quarantines(c: &dyn Db) -> StoreResult<Vec<QuarantineRecord>> {
    c.rows(
        "SELECT subscription_id, since, reason, quarantined_by FROM subscription_quarantines \
         ORDER BY subscription_id",
        p![],
        |r| {
            Ok(QuarantineRecord {
                subscription_id: r.get(0)?,
                since: r.get(1)?,
                reason: r.get(2)?,
                quarantined_by: r.get(3)?,
            })
        },
    )
}
