//! The low-level records every write path appends: run events (with the outbound webhook outbox),
//! attempt rows, subscription events, and a receipt's settled state. A leaf of `crate::sql`: the attempt,
//! session and ingest code call it; it calls none of them.

use serde_json::Value;
use tb_core::attempt::{AttemptRow, SubscriptionEvent};
use tb_core::delivery::DeliveryState;
use tb_core::ids::{new_id, IdKind};
use tb_core::outbox;
use tb_core::receipt::{self, ReceiptState};

use super::packed_events;
use super::read::{self, no_row};
use crate::p;
use crate::sql::{Col, Db, Dialect, Param, Pipeline, Row, Rows, ToParam};
use crate::StoreResult;

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
pub(crate) fn insert_run_event_with_id(
    c: &dyn Db,
    event_id: &str,
    run: &str,
    seq: u64,
    ty: &str,
    payload: &Value,
    causation: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    RunLog::new(c).append(event_id, run, seq, ty, payload, causation, now)
}

/// The live outbound webhooks (`id`, `events` JSON), read by [`live_webhooks`].
pub(crate) const LIVE_WEBHOOKS: &str = "SELECT id, events FROM webhooks WHERE deleted = 0";

/// The rows of [`LIVE_WEBHOOKS`] as the outbox rule reads them (an unreadable `events` list takes no
/// event).
pub(crate) fn live_webhooks(rows: &[Row]) -> StoreResult<Vec<outbox::LiveWebhook>> {
    rows.iter()
        .map(|r| {
            Ok(outbox::LiveWebhook {
                id: r.get(0)?,
                events: serde_json::from_str(&r.get::<String>(1)?).unwrap_or_default(),
            })
        })
        .collect()
}

/// Appends run events inside one transaction, with their outbox: one `webhook` delivery per live
/// outbound webhook that takes the event's type (the rule: `tb_core::outbox`). The live webhooks are
/// read at most once per `RunLog` (an attempt that starts a run appends two or three events), not once
/// per event.
pub(crate) struct RunLog<'c> {
    c: &'c dyn Db,
    hooks: Option<Vec<outbox::LiveWebhook>>,
}

impl<'c> RunLog<'c> {
    /// A log writer on `c` (the open transaction).
    pub(crate) fn new(c: &'c dyn Db) -> RunLog<'c> {
        RunLog { c, hooks: None }
    }

    /// A log writer on `c` that fans out to `hooks`, the live outbound webhooks the transaction read
    /// already ([`LIVE_WEBHOOKS`], sent with the statement that locked what the events follow from).
    pub(crate) fn with_hooks(c: &'c dyn Db, hooks: Vec<outbox::LiveWebhook>) -> RunLog<'c> {
        RunLog {
            c,
            hooks: Some(hooks),
        }
    }

    /// Appends event `event_id` at `seq` of run `run` and its outbox deliveries (due at `now`, Unix ms).
    /// The event id stands in the deliveries' receipt column, so (event, webhook) is unique.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append(
        &mut self,
        event_id: &str,
        run: &str,
        seq: u64,
        ty: &str,
        payload: &Value,
        causation: Option<&str>,
        now: i64,
    ) -> StoreResult<()> {
        self.append_many(&[NewRunEvent {
            event_id,
            run_id: run,
            sequence: seq,
            event_type: ty,
            payload,
            causation_id: causation,
            at: now,
        }])
    }
}

/// A run event to append with [`RunLog::append_many`]: as [`RunLog::append`]'s arguments (`at`, Unix ms,
/// is its timestamp and its outbox rows' due time).
pub(crate) struct NewRunEvent<'a> {
    pub event_id: &'a str,
    pub run_id: &'a str,
    pub sequence: u64,
    pub event_type: &'a str,
    pub payload: &'a Value,
    pub causation_id: Option<&'a str>,
    pub at: i64,
}

/// One `run_events` row as inserted: an event's, or a packed row of several (`super::packed_events`).
struct StoredRow<'a> {
    run_id: &'a str,
    sequence: u64,
    event_id: &'a str,
    event_type: &'a str,
    /// JSON text.
    payload: String,
    causation_id: Option<&'a str>,
    /// Unix ms.
    at: i64,
}

impl RunLog<'_> {
    /// The live outbound webhooks, read once per `RunLog` (unless given to [`RunLog::with_hooks`]).
    fn hooks(&mut self) -> StoreResult<&[outbox::LiveWebhook]> {
        if self.hooks.is_none() {
            self.hooks = Some(live_webhooks(&self.c.query(LIVE_WEBHOOKS, p![])?)?);
        }
        Ok(self.hooks.as_deref().unwrap_or_default())
    }

    /// Appends `events` (of any runs), one `run_events` row each, and their outbox deliveries in one
    /// multi-row `INSERT` each, sent together (they depend on nothing the database answers: one round
    /// trip on PostgreSQL); nothing when `events` is empty.
    pub(crate) fn append_many(&mut self, events: &[NewRunEvent<'_>]) -> StoreResult<()> {
        let groups: Vec<&[NewRunEvent<'_>]> = events.chunks(1).collect();
        let mut q = Pipeline::new();
        self.queue_groups(&mut q, &groups)?;
        q.send(self.c).map(drop)
    }

    /// Queues new runs' first events (`super::attempt::first_events`) on `q` (the caller sends `q` with the rest of its step): one group
    /// per run, each group as ONE packed `run_events` row (`super::packed_events`; a group that cannot
    /// share a row, one row per event), with one outbox delivery per event as [`RunLog::append_many`];
    /// nothing when `runs` holds no event.
    pub(crate) fn queue_first_events(
        &mut self,
        q: &mut Pipeline,
        runs: &[&[NewRunEvent<'_>]],
    ) -> StoreResult<()> {
        self.queue_groups(q, runs)
    }

    /// Queues `groups` on `q`: each as one packed row when [`packed_events::pack`] takes it, else one
    /// row per event; the outbox per event either way (reading the live webhooks first if this log
    /// has not read them).
    fn queue_groups(&mut self, q: &mut Pipeline, groups: &[&[NewRunEvent<'_>]]) -> StoreResult<()> {
        let events = || groups.iter().flat_map(|g| g.iter());
        if events().next().is_none() {
            return Ok(());
        }
        let c = self.c;
        let hooks = self.hooks()?;
        let outbox: Vec<outbox::OutboxDelivery> = events()
            .flat_map(|e| outbox::fan_out(hooks, e.run_id, e.event_id, e.event_type, e.at))
            .collect();
        let mut rows: Vec<StoredRow<'_>> = Vec::new();
        for group in groups {
            match packed_events::pack(group) {
                Some(p) => rows.push(StoredRow {
                    run_id: p.run_id,
                    sequence: p.sequence,
                    event_id: p.event_id,
                    event_type: packed_events::PACKED,
                    payload: p.payload,
                    causation_id: p.causation_id,
                    at: p.at,
                }),
                None => rows.extend(group.iter().map(|e| {
                    StoredRow {
                        run_id: e.run_id,
                        sequence: e.sequence,
                        event_id: e.event_id,
                        event_type: e.event_type,
                        payload: tb_core::events::stored_payload(e.event_type, e.run_id, e.payload)
                            .to_string(),
                        causation_id: e.causation_id,
                        at: e.at,
                    }
                })),
            }
        }
        use Col::{Int, Text};
        const EVENT_COLS: &[Col] = &[Text, Int, Text, Text, Text, Text, Int];
        let mut events = Rows::new(c.dialect(), EVENT_COLS);
        for r in &rows {
            events.push(&[
                r.run_id.to_param(),
                r.sequence.to_param(),
                r.event_id.to_param(),
                r.event_type.to_param(),
                r.payload.to_param(),
                r.causation_id.to_param(),
                r.at.to_param(),
            ]);
        }
        let events_sql = format!(
            "INSERT INTO run_events (run_id, sequence, event_id, type, payload, causation_id, timestamp) {}",
            events.values()
        );
        let params = events.params()?;
        // The outbox rows in chunks of at most OUTBOX_ROWS (5 parameters each on SQLite: many live
        // webhooks times a batch's events stay under its parameters per statement; 5 arrays on
        // PostgreSQL).
        const OUTBOX_ROWS: usize = 2_000;
        const OUTBOX_COLS: &[Col] = &[Text, Text, Text, Text, Int];
        let chunks: Vec<Rows<'_>> = outbox
            .chunks(OUTBOX_ROWS)
            .map(|chunk| {
                let mut rows = Rows::new(c.dialect(), OUTBOX_COLS);
                for o in chunk {
                    rows.push(&[
                        o.id.to_param(),
                        o.event_id.to_param(),
                        o.webhook_id.to_param(),
                        o.run_id.to_param(),
                        o.due_at.to_param(),
                    ]);
                }
                rows
            })
            .collect();
        let chunks: Vec<(String, Vec<Param<'_>>)> = chunks
            .iter()
            .map(|rows| {
                let sql = format!(
                    "INSERT INTO deliveries (id, receipt_id, subscription_id, binding_id, dedup_key, action, workflow_id, run_id, \
                       inputs, state, due_at, created_at, updated_at, kind) \
                     SELECT v.column1, v.column2, v.column3, v.column3, v.column2, 'webhook', NULL, v.column4, '{{}}', \
                       'pending', v.column5, v.column5, v.column5, 'outbound_webhook' FROM {}",
                    rows.table()
                );
                Ok((sql, rows.params()?))
            })
            .collect::<StoreResult<_>>()?;
        q.push(events_sql, &params);
        for (sql, ps) in chunks {
            q.push(sql, &ps);
        }
        Ok(())
    }
}

/// Settles receipt `receipt_id` after one of its deliveries changed (a session consumed its effect):
/// the receipt row is locked (`FOR UPDATE` on PostgreSQL), its deliveries are read in a later statement
/// (so two deliveries ending at once on two replicas cannot both see the other still open), and
/// [`receipt::settled_state`] says what to write. `now` is Unix ms.
pub(crate) fn settle_receipt(c: &dyn Db, receipt_id: &str, now: i64) -> StoreResult<()> {
    let current: String = c
        .value(
            &format!(
                "SELECT state FROM receipts WHERE id = ?1{}",
                c.dialect().for_update()
            ),
            p![receipt_id],
        )?
        .ok_or_else(no_row)?;
    let current =
        ReceiptState::parse(&current).ok_or_else(|| read::bad("receipt state", &current))?;
    let rows = c.rows(
        "SELECT state, dead_letter_reason, consumed_at IS NOT NULL FROM deliveries WHERE receipt_id = ?1",
        p![receipt_id],
        |r| {
            let s: String = r.get(0)?;
            Ok((
                DeliveryState::parse(&s).ok_or_else(|| read::bad("delivery state", &s))?,
                r.get::<Option<String>>(1)?,
                r.get::<bool>(2)?,
            ))
        },
    )?;
    let views: Vec<receipt::DeliveryView> = rows
        .iter()
        .map(|(state, reason, consumed)| receipt::DeliveryView {
            state: *state,
            reason: reason.as_deref(),
            consumed: *consumed,
        })
        .collect();
    if let Some(settled) = receipt::settled_state(current, &views) {
        c.exec(
            "UPDATE receipts SET state = ?2, updated_at = ?3 WHERE id = ?1",
            p![receipt_id, settled.as_str(), now],
        )?;
    }
    Ok(())
}

/// Inserts an `attempts` row.
pub(crate) fn insert_attempt(c: &dyn Db, a: &AttemptRow) -> StoreResult<()> {
    insert_attempts(c, &[a])
}

/// Inserts `attempts` rows in one multi-row `INSERT` (nothing when `rows` is empty).
pub(crate) fn insert_attempts(c: &dyn Db, rows: &[&AttemptRow]) -> StoreResult<()> {
    let mut q = Pipeline::new();
    queue_attempts(&mut q, c.dialect(), rows)?;
    q.send(c).map(drop)
}

/// [`insert_attempts`] queued on `q` (in `dialect`) instead of run.
pub(crate) fn queue_attempts(
    q: &mut Pipeline,
    dialect: Dialect,
    rows: &[&AttemptRow],
) -> StoreResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    use Col::{Int, Text};
    const COLS: &[Col] = &[Text, Int, Text, Text, Text, Int, Int, Int, Text];
    let mut attempts = Rows::new(dialect, COLS);
    for a in rows {
        attempts.push(&[
            a.delivery_id.to_param(),
            a.attempt.to_param(),
            a.event_id.to_param(),
            a.outcome.as_str().to_param(),
            a.error_class.to_param(),
            a.started_at.to_param(),
            a.duration_ms.to_param(),
            a.next_due_at.to_param(),
            a.message.to_param(),
        ]);
    }
    q.push(
        format!(
            "INSERT INTO attempts (delivery_id, attempt, event_id, outcome, error_class, started_at, \
             duration_ms, next_due_at, message) {}",
            attempts.values()
        ),
        &attempts.params()?,
    );
    Ok(())
}

/// Inserts a run-less trigger event into `subscription_events`.
pub(crate) fn insert_event(c: &dyn Db, e: &SubscriptionEvent) -> StoreResult<()> {
    insert_events(c, std::slice::from_ref(e))
}

/// Inserts run-less trigger events into `subscription_events` in one multi-row `INSERT` (nothing when
/// `events` is empty).
pub(crate) fn insert_events(c: &dyn Db, events: &[SubscriptionEvent]) -> StoreResult<()> {
    let mut q = Pipeline::new();
    queue_events(&mut q, c.dialect(), events)?;
    q.send(c).map(drop)
}

/// [`insert_events`] queued on `q` (in `dialect`) instead of run.
pub(crate) fn queue_events(
    q: &mut Pipeline,
    dialect: Dialect,
    events: &[SubscriptionEvent],
) -> StoreResult<()> {
    if let [e] = events {
        q.push(
            "INSERT INTO subscription_events (event_id, subscription_id, type, payload, delivery_id, timestamp) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            p![
                e.event_id,
                e.subscription_id,
                e.event_type,
                e.payload.to_string(),
                e.delivery_id,
                e.timestamp
            ],
        );
        return Ok(());
    }
    if events.is_empty() {
        return Ok(());
    }
    use Col::{Int, Text};
    const COLS: &[Col] = &[Text, Text, Text, Text, Text, Int];
    let payloads: Vec<String> = events.iter().map(|e| e.payload.to_string()).collect();
    let mut rows = Rows::new(dialect, COLS);
    for (e, payload) in events.iter().zip(&payloads) {
        rows.push(&[
            e.event_id.to_param(),
            e.subscription_id.to_param(),
            e.event_type.to_param(),
            payload.to_param(),
            e.delivery_id.to_param(),
            e.timestamp.to_param(),
        ]);
    }
    q.push(
        format!(
            "INSERT INTO subscription_events (event_id, subscription_id, type, payload, delivery_id, timestamp) {}",
            rows.values()
        ),
        &rows.params()?,
    );
    Ok(())
}
