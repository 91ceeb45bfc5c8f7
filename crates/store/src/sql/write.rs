//! Write transactions shared by every backend (the attempt's commit is `super::attempt`, leases
//! `super::lease`). Each function runs inside the backend's write transaction (on SQLite in its own
//! savepoint of the writer's batch); an `Err` rolls back just that function's writes. The decisions are
//! `tb_core`'s: this file loads, locks and writes.

use std::sync::LazyLock;

use crate::p;
use crate::sql::{Col, Db, Dialect, IdList, Param, Rows, ToParam};
use serde_json::Value;
use tb_core::attempt;
use tb_core::delivery::DeliveryState;
use tb_core::events::{self, SubscriptionStateChanged};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease;
use tb_core::receipt::ReceiptState;
use tb_core::replay;
use tb_core::retention;
use tb_core::run::{self, RunStatus};
use tb_core::subscription::{transition, SubscriptionInput, Transition};

use super::read::{self, no_row};
use crate::model::*;
use crate::{RecordKind, StoreError, StoreResult};

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

/// Inserts a new subscription; `None` when its id is taken (by a live or a retired one). The unique
/// key decides, so two creates racing on one id give one winner.
pub(crate) fn insert_subscription(
    c: &dyn Db,
    d: &SubscriptionDef,
    now: i64,
) -> StoreResult<Option<SubscriptionRecord>> {
    let n = c.exec(
        "INSERT INTO subscriptions (id, source, connector, config, state, failure_threshold, created_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, 'active', ?5, ?6, ?6) ON CONFLICT(id) DO NOTHING",
        p![d.id, read::source_str(d.source), d.connector, d.config.to_string(), d.failure_threshold, now],
    )?;
    if n == 0 {
        return Ok(None);
    }
    read::get_subscription(c, &d.id).map(Some)
}

/// `normalized` and `inputs` (one per delivery) are the JSON texts, serialized by the caller so the
/// writer thread does no serialization. The receipt's insert (which carries its raw body) decides (a
/// taken dedup key is a duplicate). Its deliveries are sent with it, in the same pipeline (one round
/// trip on PostgreSQL): each insert is guarded by the receipt's row existing ([`guarded_delivery`]), so
/// a duplicate inserts none. Deliveries handed over at commit ([`NewReceipt::lease`]) are written
/// leased, and their [`Lease`]s are built from what was written (no read back).
pub(crate) fn commit_receipt(
    c: &dyn Db,
    r: &NewReceipt,
    normalized: &str,
    inputs: &[String],
) -> StoreResult<IngestOutcome> {
    if let Some(cap) = &r.capability {
        super::session::use_capability(c, cap, r.received_at)?;
    }
    // Built once: the writer thread (SQLite's only one) does no formatting per receipt.
    static ONE_RECEIPT: LazyLock<String> =
        LazyLock::new(|| format!("{INSERT_RECEIPT} VALUES {} {ON_DEDUP}", receipt_values(1)));
    static ONE_DELIVERY: LazyLock<String> = LazyLock::new(guarded_delivery);
    let row = receipt_params(r, normalized);
    let plan = ReceiptPlan::new(r, inputs);
    let delivery_params = plan.delivery_params();
    let mut writes: Vec<(&str, &[Param<'_>])> = vec![(ONE_RECEIPT.as_str(), &row[..])];
    writes.extend(
        delivery_params
            .iter()
            .map(|ps| (ONE_DELIVERY.as_str(), &ps[..])),
    );
    let counts = c.exec_many(&writes)?;
    if counts[0] == 0 {
        // Nothing of it was written: each delivery's guard found no receipt row, or (the same receipt
        // committed again after an unknown outcome) its own row already there. A delivery written
        // anyway (that receipt's delivery row gone, e.g. swept) must not commit under a duplicate.
        if counts[1..].iter().any(|n| *n != 0) {
            return Err(StoreError::Database(
                "a duplicate receipt inserted a delivery: its receipt id exists already".into(),
            ));
        }
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
    if let Some(k) = counts[1..].iter().position(|n| *n != 1) {
        // The receipt is new, so each of its deliveries must be too: a taken id is a bug, never skipped.
        return Err(StoreError::Database(format!(
            "delivery {} of a new receipt was not inserted: its id is taken",
            k + 1
        )));
    }
    plan.finish(c)
}

/// One delivery of a receipt, sent in the receipt's own pipeline: its [`INSERT_DELIVERY_INTO`] from its
/// [`ReceiptPlan::delivery_params`] (each cast to its column's type, since a `SELECT` list gives
/// PostgreSQL no column to infer it from), inserted only when its receipt's row exists (`WHERE EXISTS`:
/// the receipt's insert just before it wrote the row, or found its dedup key taken and wrote nothing).
/// A delivery whose id exists inserts nothing (`ON CONFLICT (id) DO NOTHING`): the same receipt
/// committed a second time (a retry after an unknown commit outcome) finds its first commit's rows
/// and is a duplicate; [`commit_receipt`] refuses a new receipt whose delivery inserted nothing.
fn guarded_delivery() -> String {
    let values: Vec<String> = DELIVERY_COLS
        .iter()
        .enumerate()
        .map(|(k, col)| {
            match col {
                Col::Int => format!("CAST(?{} AS BIGINT)", k + 1),
                Col::Text => format!("CAST(?{} AS TEXT)", k + 1),
                // No delivery column holds bytes; the two dialects name the type differently.
                Col::Blob => format!("?{}", k + 1),
            }
        })
        .collect();
    // `updated_at` is `created_at` (the 13th parameter).
    format!(
        "{INSERT_DELIVERY_INTO} SELECT {}, {}, {} WHERE EXISTS (SELECT 1 FROM receipts WHERE id = ?2) \
         ON CONFLICT (id) DO NOTHING",
        values[..13].join(", "),
        values[12],
        values[13..].join(", ")
    )
}

/// The receipt's insert up to its `VALUES` (the columns of [`receipt_params`]). The raw body is the
/// receipt's own `body` column: one row per receipt (docs/architecture.md, "Storage").
pub(crate) const INSERT_RECEIPT: &str = "INSERT INTO receipts (id, subscription_id, dedup_key, \
     provider_event_id, event_type, normalized, state, content_type, body_bytes, received_at, updated_at, \
     dedup_until, dedup_live, deliveries, source, body)";
/// What a taken dedup key does to the receipt's insert: nothing (the insert reports 0 rows).
pub(crate) const ON_DEDUP: &str =
    "ON CONFLICT (subscription_id, dedup_key) WHERE dedup_live = 1 DO NOTHING";
/// The deliveries' insert up to its rows (the columns of [`ReceiptPlan::delivery_params`], with
/// `created_at` bound twice: `updated_at` is `created_at`).
pub(crate) const INSERT_DELIVERY_INTO: &str =
    "INSERT INTO deliveries (id, receipt_id, subscription_id, binding_id, dedup_key, action, workflow_id, run_id, \
     inputs, state, due_at, dead_letter_reason, created_at, updated_at, params, lease_owner, lease_token, lease_until, kind, trace_context)";

/// `n` rows of [`INSERT_RECEIPT`]'s values, [`RECEIPT_PARAMS`] parameters each ([`receipt_params`]);
/// `updated_at` is `received_at` and `dedup_live` is 1 while the window is open.
pub(crate) fn receipt_values(n: usize) -> String {
    (0..n)
        .map(|i| {
            let k = |j: usize| i * RECEIPT_PARAMS + j;
            format!(
                "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{}, \
                 CASE WHEN CAST(?{} AS BIGINT) > CAST(?{} AS BIGINT) THEN 1 ELSE 0 END, ?{}, ?{}, ?{})",
                k(1),
                k(2),
                k(3),
                k(4),
                k(5),
                k(6),
                k(7),
                k(8),
                k(9),
                k(10),
                k(10),
                k(11),
                k(11),
                k(10),
                k(12),
                k(13),
                k(14)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of [`receipt_params`], in order: the rows of the batch path's receipts insert
/// ([`insert_receipts_sql`]).
pub(crate) const RECEIPT_COLS: &[Col] = {
    use Col::{Blob, Int, Text};
    &[
        Text, Text, Text, Text, Text, Text, Text, Text, Int, Int, Int, Int, Text, Blob,
    ]
};

/// The batch path's receipts insert: [`INSERT_RECEIPT`] of `rows` ([`RECEIPT_COLS`], each row
/// [`receipt_params`]), the same columns as [`receipt_values`] (`updated_at` is `received_at`,
/// `dedup_live` is 1 while the window is open), then [`ON_DEDUP`] and `RETURNING id`. The rows are
/// inserted in their order. One text for any number of rows on PostgreSQL ([`Rows`]); `WHERE true`
/// lets SQLite parse the `ON CONFLICT` after a `SELECT` (sqlite.org/lang_upsert.html, "Parsing
/// Ambiguity").
pub(crate) fn insert_receipts_sql(rows: &Rows<'_>) -> String {
    format!(
        "{INSERT_RECEIPT} SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, \
         v.column7, v.column8, v.column9, v.column10, v.column10, v.column11, \
         CASE WHEN v.column11 > v.column10 THEN 1 ELSE 0 END, v.column12, v.column13, v.column14 \
         FROM {} WHERE true {ON_DEDUP} RETURNING id",
        rows.table()
    )
}

/// The columns of [`ReceiptPlan::delivery_params`], in order: the rows of the batch path's
/// deliveries insert ([`insert_deliveries_sql`]).
pub(crate) const DELIVERY_COLS: &[Col] = {
    use Col::{Int, Text};
    &[
        Text, Text, Text, Text, Text, Text, Text, Text, Text, Text, Int, Text, Int, Text, Text,
        Text, Int, Text, Text,
    ]
};

/// The batch path's deliveries insert: [`INSERT_DELIVERY_INTO`] of `rows` ([`DELIVERY_COLS`], each
/// row [`ReceiptPlan::delivery_params`]; `updated_at` is `created_at`). One
/// text for any number of rows on PostgreSQL ([`Rows`]).
pub(crate) fn insert_deliveries_sql(rows: &Rows<'_>) -> String {
    format!(
        "{INSERT_DELIVERY_INTO} SELECT v.column1, v.column2, v.column3, v.column4, v.column5, \
         v.column6, v.column7, v.column8, v.column9, v.column10, v.column11, v.column12, v.column13, \
         v.column13, v.column14, v.column15, v.column16, v.column17, v.column18, v.column19 FROM {}",
        rows.table()
    )
}

/// Parameters of one receipt's row in [`receipt_values`].
pub(crate) const RECEIPT_PARAMS: usize = 14;

/// One receipt's [`RECEIPT_PARAMS`] parameters of [`receipt_values`] (`received_at` is bound once, as
/// the 10th). The body is the last: `NULL` when empty, so an empty body takes no bytes and reads as
/// empty ([`read::get_body`]).
pub(crate) fn receipt_params<'a>(r: &'a NewReceipt, normalized: &'a str) -> Vec<Param<'a>> {
    vec![
        r.id.to_param(),
        r.subscription_id.to_param(),
        r.dedup_key.to_param(),
        r.provider_event_id.to_param(),
        r.event_type.to_param(),
        normalized.to_param(),
        r.state.as_str().to_param(),
        r.content_type.to_param(),
        Param::Int(r.body.len() as i64),
        r.received_at.to_param(),
        r.dedup_until.to_param(),
        Param::Int(r.deliveries.len() as i64),
        r.source.as_str().to_param(),
        if r.body.is_empty() {
            Param::Null
        } else {
            Param::Blob(&r.body)
        },
    ]
}

/// One delivery row of a receipt about to be written.
pub(crate) struct PlannedDelivery<'a> {
    d: &'a NewDelivery,
    inputs: &'a str,
    due: Option<i64>,
    params: Option<String>,
    /// Written leased under the plan's grant.
    handed: bool,
}

/// A newly inserted receipt's deliveries, with the leases handed over at commit: built before they are
/// written, so one receipt or many (`crate::sql::ingest_batch`) write the same rows.
pub(crate) struct ReceiptPlan<'a> {
    r: &'a NewReceipt,
    /// The lease request and the one grant its handed deliveries share.
    grant: Option<(&'a LeaseRequest, lease::LeaseGrant)>,
    rows: Vec<PlannedDelivery<'a>>,
}

impl<'a> ReceiptPlan<'a> {
    /// Plans `r`'s deliveries (`inputs`: one JSON text each). Hand-off at commit: the first `limit`
    /// pending deliveries are written leased under one fresh grant (as `lease_due` would lease them:
    /// `due_at = lease_until`, so no worker finds them due until the lease lapses).
    pub(crate) fn new(r: &'a NewReceipt, inputs: &'a [String]) -> Self {
        let grant = r
            .lease
            .as_ref()
            .map(|l| (l, lease::grant(r.received_at, l.lease_ms)));
        let mut to_lease = r.lease.as_ref().map_or(0, |l| l.limit);
        let rows = r
            .deliveries
            .iter()
            .zip(inputs)
            .map(|(d, inputs)| {
                let pending = d.state == DeliveryState::Pending;
                let handed = grant.is_some() && pending && to_lease > 0;
                if handed {
                    to_lease -= 1;
                }
                let due = match &grant {
                    Some((_, g)) if handed => Some(g.due_at),
                    _ => pending.then_some(r.received_at),
                };
                PlannedDelivery {
                    d,
                    inputs,
                    due,
                    params: d.params.as_ref().map(|p| p.to_string()),
                    handed,
                }
            })
            .collect();
        ReceiptPlan { r, grant, rows }
    }

    /// The lease request and grant of a delivery written leased.
    fn handed(&self, w: &PlannedDelivery<'_>) -> Option<(&LeaseRequest, &lease::LeaseGrant)> {
        match &self.grant {
            Some((l, g)) if w.handed => Some((*l, g)),
            _ => None,
        }
    }

    /// The 19 parameters of [`INSERT_DELIVERY_INTO`]'s row (`created_at` once) for each delivery.
    pub(crate) fn delivery_params(&self) -> Vec<[Param<'_>; 19]> {
        let r = self.r;
        self.rows
            .iter()
            .map(|w| {
                let handed = self.handed(w);
                [
                    w.d.id.to_param(),
                    r.id.to_param(),
                    r.subscription_id.to_param(),
                    w.d.binding_id.to_param(),
                    r.dedup_key.to_param(),
                    w.d.action.to_param(),
                    w.d.workflow_id.to_param(),
                    w.d.run_id.to_param(),
                    w.inputs.to_param(),
                    w.d.state.as_str().to_param(),
                    w.due.to_param(),
                    w.d.dead_letter_reason.to_param(),
                    r.received_at.to_param(),
                    w.params.to_param(),
                    handed.map_or(Param::Null, |(l, _)| Param::Text(&l.owner)),
                    handed.map_or(Param::Null, |(_, g)| Param::Text(&g.token)),
                    handed.map_or(Param::Null, |(_, g)| Param::Int(g.until)),
                    w.d.kind.as_str().to_param(),
                    r.trace_context.to_param(),
                ]
            })
            .collect()
    }

    /// After the rows are written: the dead-letter records of deliveries created dead-lettered, and
    /// the answer.
    pub(crate) fn finish(&self, c: &dyn Db) -> StoreResult<IngestOutcome> {
        let r = self.r;
        let mut refs = Vec::with_capacity(self.rows.len());
        let mut leased = Vec::new();
        for w in &self.rows {
            let d = w.d;
            if let Some((l, g)) = self.handed(w) {
                leased.push(Lease {
                    delivery: DeliveryRecord {
                        id: d.id.clone(),
                        receipt_id: r.id.clone(),
                        subscription_id: r.subscription_id.clone(),
                        binding_id: d.binding_id.clone(),
                        dedup_key: r.dedup_key.clone(),
                        action: d.action.clone(),
                        workflow_id: d.workflow_id.clone(),
                        run_id: d.run_id.clone(),
                        inputs: d.inputs.clone(),
                        state: d.state,
                        attempts: 0,
                        replays: 0,
                        due_at: w.due,
                        lease_until: Some(g.until),
                        lease_owner: Some(l.owner.clone()),
                        first_attempt_at: None,
                        last_error: None,
                        dead_letter_reason: d.dead_letter_reason.clone(),
                        created_at: r.received_at,
                        updated_at: r.received_at,
                        params: d.params.clone(),
                        consumed_at: None,
                        kind: d.kind,
                        trace_context: r.trace_context.clone(),
                    },
                    owner: l.owner.clone(),
                    token: g.token.clone(),
                    lease_until: g.until,
                    lease_ms: l.lease_ms,
                    lost: None,
                });
            }
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
            leased,
        })
    }
}

/// A delivery created dead-lettered (its subscription is dead-lettered) is recorded as attempt 1 with
/// its `trigger.delivery.attempted` event ([`tb_core::attempt::dead_lettered_at_ingest`]).
fn dead_letter_at_ingest(c: &dyn Db, r: &NewReceipt, d: &NewDelivery) -> StoreResult<()> {
    let w = attempt::dead_lettered_at_ingest(
        &d.id,
        &r.subscription_id,
        &r.dedup_key,
        d.dead_letter_reason.as_deref(),
        r.received_at,
    );
    super::log::insert_attempt(c, &w.attempt)?;
    c.exec(
        "UPDATE deliveries SET attempts = ?2, first_attempt_at = ?3 WHERE id = ?1",
        p![d.id, w.attempt.attempt, w.first_attempt_at],
    )?;
    super::log::insert_event(c, &w.event)
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
    let payload = serde_json::to_value(SubscriptionStateChanged::of(&sub.id, sub.source, t))
        .expect("serializable");
    super::log::insert_event(
        c,
        &tb_core::attempt::SubscriptionEvent {
            event_id: new_id(IdKind::Event),
            subscription_id: sub.id.clone(),
            event_type: events::SUBSCRIPTION_STATE_CHANGED,
            payload,
            delivery_id: cause.map(str::to_string),
            timestamp: now,
        },
    )
}

/// An operator's (or the breaker's cool-down's) input to subscription `id` at `now` (Unix ms): the row
/// is locked, [`transition`] decides, and [`Transition::resets_streak`] says whether the failure streak
/// is cleared. Errors: `NotFound("subscription")`.
pub(crate) fn apply_subscription_input(
    c: &dyn Db,
    id: &str,
    input: SubscriptionInput,
    now: i64,
) -> StoreResult<Option<Transition>> {
    let sub = read::lock_subscription(c, id)?;
    let t = transition(sub.state, input);
    if let Some(t) = &t {
        apply_transition(c, &sub, t, None, now)?;
        if t.resets_streak() {
            c.exec(
                "UPDATE subscriptions SET consecutive_failures = 0, first_failure_at = NULL WHERE id = ?1",
                p![id],
            )?;
        }
    }
    Ok(t)
}

/// Ends run `run_id` with `status` at `now` (Unix ms): the run row is locked, [`run::finish`] checks
/// the end and names the terminal event, the session rules' run-end expiry writes its events, then the
/// status, output and the terminal event at the run's next sequence. Errors: `NotFound("run")`;
/// `Conflict` with [`run::FinishRefused`]'s sentence.
pub(crate) fn finish_run(
    c: &dyn Db,
    run_id: &str,
    status: RunStatus,
    output: Option<&Value>,
    now: i64,
) -> StoreResult<RunRecord> {
    let current = read::lock_run(c, run_id)?;
    let ty =
        run::finish(current.status, status).map_err(|e| StoreError::Conflict(e.to_string()))?;
    // Stop / cancel wins the armed wait (DESIGN §4 Wait); its events come before the terminal one.
    super::session::on_run_end(c, run_id, now)?;
    let seq: i64 = c
        .row("UPDATE runs SET status = ?2, output = ?3, wait_reason = NULL, updated_at = ?4, next_sequence = next_sequence + 1 WHERE id = ?1 RETURNING next_sequence - 1", p![run_id, status.as_str(), output.map(|o| o.to_string()), now], |r| r.get(0))?
        .ok_or_else(|| StoreError::not_found(RecordKind::Run))?;
    super::log::insert_run_event(c, run_id, seq as u64, ty, &serde_json::json!({}), None, now)?;
    read::get_run(c, run_id)
}

/// Puts dead-lettered delivery `id` back in the queue at `now` (Unix ms): the delivery row is locked and
/// [`replay::reopen`] decides its new state, due time and replay count and the receipt's state.
/// Errors: `NotFound("delivery")`; `Conflict` with [`replay::NotDeadLettered`]'s sentence.
pub(crate) fn replay_delivery(c: &dyn Db, id: &str, now: i64) -> StoreResult<DeliveryRecord> {
    let d = read::lock_delivery(c, id)?;
    let r =
        replay::reopen(d.state, d.replays, now).map_err(|e| StoreError::Conflict(e.to_string()))?;
    c.exec(
        "UPDATE deliveries SET state = ?2, due_at = ?3, replays = ?4, dead_letter_reason = NULL, \
         lease_owner = NULL, lease_token = NULL, lease_until = NULL, updated_at = ?5 WHERE id = ?1",
        p![id, r.state.as_str(), r.due_at, r.replays, now],
    )?;
    c.exec(
        "UPDATE receipts SET state = ?2, updated_at = ?3 WHERE id = ?1",
        p![d.receipt_id, r.receipt_state.as_str(), now],
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
        // Walk the receipts that still hold a body (never those whose body is already gone), by the
        // partial index `receipts_body_held`.
        let page: Vec<(String, String, i64)> = c.rows(
            "SELECT id, state, received_at FROM receipts \
             WHERE body IS NOT NULL AND id > ?1 ORDER BY id LIMIT ?2",
            p![next.bodies_after.as_deref().unwrap_or(""), batch],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        next.bodies_done = page.len() < batch as usize;
        let mut due_ids: Vec<&str> = Vec::new();
        for (id, state, received_at) in &page {
            if retention::body_walk_ends(*received_at, bodies_before) {
                next.bodies_done = true;
                break;
            }
            let due = ReceiptState::parse(state)
                .is_some_and(|s| retention::body_expired(s, *received_at, bodies_before));
            if due {
                due_ids.push(id);
            }
            next.bodies_after = Some(id.clone());
        }
        // One statement for the page's expired bodies (a statement per receipt was most of the cost).
        if !due_ids.is_empty() {
            let ids = IdList::new(c.dialect(), &due_ids);
            counts.bodies += c.exec(
                &format!(
                    "UPDATE receipts SET body = NULL WHERE {} AND body IS NOT NULL",
                    ids.condition("id")
                ),
                &ids.params(),
            )?;
        }
    }
    if !next.dead_letters_done {
        let page: Vec<(String, String, i64)> = c
            .rows(
                "SELECT id, state, updated_at FROM deliveries WHERE state = 'dead-lettered' AND id > ?1 \
                 ORDER BY id LIMIT ?2", p![next.dead_letters_after.as_deref().unwrap_or(""), batch], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        let due_ids: Vec<&str> = page
            .iter()
            .filter(|(_, state, updated_at)| {
                DeliveryState::parse(state).is_some_and(|s| {
                    retention::dead_letter_expired(s, *updated_at, dead_letters_before)
                })
            })
            .map(|(id, _, _)| id.as_str())
            .collect();
        if !due_ids.is_empty() {
            let ids = IdList::new(c.dialect(), &due_ids);
            c.exec(
                &format!(
                    "DELETE FROM attempts WHERE {}",
                    ids.condition("delivery_id")
                ),
                &ids.params(),
            )?;
            counts.dead_letters += c.exec(
                &format!("DELETE FROM deliveries WHERE {}", ids.condition("id")),
                &ids.params(),
            )?;
        }
        next.dead_letters_done = page.len() < batch as usize;
        next.dead_letters_after = page.last().map(|(id, _, _)| id.clone());
    }
    if !next.idempotency_done {
        // Deleted rows leave the candidate set, so "fewer than a batch" means none is left.
        counts.idempotency = c
            .exec("DELETE FROM idempotency_keys WHERE (scope, key) IN (SELECT scope, key FROM idempotency_keys WHERE expires_at <= ?1 LIMIT ?2)", p![now, batch])?;
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
        return Err(StoreError::not_found(RecordKind::Webhook));
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

/// Adds each count to its `ingress_counts` row and reads the row's new total back (`RETURNING`, one
/// statement per row); deletes rows before `prune_before` first when given.
pub(crate) fn add_ingress_counts(
    c: &dyn Db,
    counts: &[IngressCount],
    prune_before: Option<i64>,
) -> StoreResult<Vec<u64>> {
    if let Some(m) = prune_before {
        c.exec("DELETE FROM ingress_counts WHERE minute < ?1", p![m])?;
    }
    let mut totals = Vec::with_capacity(counts.len());
    for k in counts {
        let n: i64 = c
            .value(
                "INSERT INTO ingress_counts (minute, scope, key, outcome, n) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (minute, scope, key, outcome) DO UPDATE SET n = ingress_counts.n + excluded.n \
                 RETURNING n",
                p![k.minute, k.scope, k.key, k.outcome, k.n],
            )?
            .ok_or_else(|| StoreError::Database("ingress count upsert returned no row".into()))?;
        totals.push(n.max(0) as u64);
    }
    Ok(totals)
}

/// Inserts a quarantine row; `false` when the subscription already had one.
pub(crate) fn quarantine_subscription(c: &dyn Db, q: &QuarantineRecord) -> StoreResult<bool> {
    let n = c.exec(
        "INSERT INTO subscription_quarantines (subscription_id, since, reason, quarantined_by) \
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (subscription_id) DO NOTHING",
        p![q.subscription_id, q.since, q.reason, q.quarantined_by],
    )?;
    Ok(n == 1)
}

/// Deletes a quarantine row; `false` when there was none.
pub(crate) fn release_subscription(c: &dyn Db, id: &str) -> StoreResult<bool> {
    let n = c.exec(
        "DELETE FROM subscription_quarantines WHERE subscription_id = ?1",
        p![id],
    )?;
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::guarded_delivery;

    #[test]
    fn a_guarded_delivery_binds_created_at_twice_and_waits_for_its_receipt() {
        let sql = guarded_delivery();
        assert!(
            sql.contains("SELECT CAST(?1 AS TEXT), CAST(?2 AS TEXT),"),
            "{sql}"
        );
        assert!(
            sql.contains(
                "CAST(?12 AS TEXT), CAST(?13 AS BIGINT), CAST(?13 AS BIGINT), CAST(?14 AS TEXT),"
            ),
            "{sql}"
        );
        assert!(
            sql.ends_with(
                "CAST(?19 AS TEXT) WHERE EXISTS (SELECT 1 FROM receipts WHERE id = ?2) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            "{sql}"
        );
    }
}
