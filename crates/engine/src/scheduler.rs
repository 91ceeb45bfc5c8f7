//! The cron scheduler: an edge module, not a pipeline. Each pass reads the due schedules'
//! cursors, asks `tb_core::schedule::plan` what to fire, hands every fire to [`accept`] as an
//! [`Inbound`] with the tick's dedup key, and moves the cursor by compare-and-set.
//!
//! **No leader.** Every replica runs this loop. Two loops that plan from one cursor plan the same fires
//! with the same dedup keys: the second commit of a tick is answered `duplicate` by the receipt's
//! unique key, and the second compare-and-set of the cursor loses (it re-reads next pass). A crash
//! between the commit and the cursor write re-plans the tick, which is again a duplicate. So each tick
//! gives at most one receipt (and one run per binding) however many loops run, and the cursor never
//! moves past a tick that was not committed (a failed commit leaves it, the tick stays due and its lag
//! grows: `tb_schedule_lag_seconds`, and `GET /ready` past the grace).
//!
//! Time is injected: [`Scheduler::pass`] takes "now", so tests drive DST days and outages without
//! waiting; [`run`] calls it with the wall clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tb_core::connector::ConnectorSpec;
use tb_core::dedup::dedup_key;
use tb_core::normalized::NormalizedEvent;
use tb_core::receipt::ReceiptSource;
use tb_core::schedule::plan::{lag_ms, plan, Cursor, Fire, PassInput};
use tb_core::schedule::{utc_rfc3339, Overlap, Schedule, ScheduleSpec, TICK_ACTION, TICK_EVENT};
use tb_core::subscription::SubscriptionState;
use tb_core::{ErrorCode, TbError};

use crate::accept::{accept, Accepted, Dedup, Inbound, IngestAnswer, Routing};
use crate::{clock, store_err, Engine};

/// A due tick not fired this long (ms) after its fire time is late: `tb_schedules_late`,
/// `tb_schedule_lag_seconds` and `GET /ready` show it (30 000 ms).
pub const LATE_AFTER_MS: u64 = 30_000;

/// Longest sleep between passes: a new, resumed or edited schedule is seen within this (1 s).
pub const MAX_SLEEP: Duration = Duration::from_secs(1);

/// What one [`Scheduler::pass`] did, summed over the schedules it looked at.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Ticks committed as new receipts.
    pub fired: u64,
    /// Ticks another loop had committed first (answered `duplicate`).
    pub duplicates: u64,
    /// Ticks missed (older than the grace) and not fired.
    pub missed: u64,
    /// Ticks skipped while the subscription was paused.
    pub paused: u64,
    /// Ticks skipped by the overlap policy.
    pub overlap_skipped: u64,
    /// Cursor writes lost to another loop.
    pub lost_races: u64,
    /// Schedules whose pass failed (store unavailable): their cursor stays, their ticks stay due.
    pub failed: u64,
    /// The receipts committed or found, in order.
    pub receipts: Vec<String>,
}

/// A schedule whose due tick has not fired within [`LATE_AFTER_MS`] (`GET /ready` detail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Late {
    pub subscription: String,
    /// How long past its fire time the oldest unhandled tick is, in ms.
    pub lag_ms: u64,
}

/// The scheduler of one engine: compiled schedules and each one's next fire time (a hint: the cursor
/// in the store is the record).
#[derive(Default)]
pub struct Scheduler {
    compiled: HashMap<String, (ScheduleSpec, Arc<Schedule>)>,
    /// Next fire time per schedule as of its last pass (Unix ms); `None` past its end.
    next_fire: HashMap<String, Option<i64>>,
    /// Schedules late past their grace, for `GET /ready` (shared with the engine).
    late: Arc<Mutex<Vec<Late>>>,
    /// Schedules whose last pass failed (logged once per failure streak).
    failing: std::collections::HashSet<String>,
}

impl Scheduler {
    /// A scheduler that publishes its late schedules into `late` (read by `GET /ready`).
    pub fn new(late: Arc<Mutex<Vec<Late>>>) -> Scheduler {
        Scheduler {
            late,
            ..Default::default()
        }
    }

    /// The schedule subscriptions of the catalog, compiled (cached while their spec is unchanged). A
    /// spec that does not compile (config and API validate first, so only a hand-edited store) is
    /// logged once and skipped.
    fn schedules(&mut self, engine: &Engine) -> Vec<(String, Arc<Schedule>, u64)> {
        let catalog = engine.catalog();
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for sub in catalog.subscriptions() {
            let ConnectorSpec::Schedule(spec) = &sub.connector else {
                continue;
            };
            seen.insert(sub.id.clone());
            let fresh = match self.compiled.get(&sub.id) {
                Some((s, c)) if s == spec => Some(c.clone()),
                _ => None,
            };
            let compiled = match fresh {
                Some(c) => c,
                None => match Schedule::new(spec.clone()) {
                    Ok(c) => {
                        let c = Arc::new(c);
                        self.compiled
                            .insert(sub.id.clone(), (spec.clone(), c.clone()));
                        self.next_fire.remove(&sub.id);
                        c
                    }
                    Err(e) => {
                        if self.next_fire.insert(sub.id.clone(), None).is_none() {
                            tracing::error!(subscription = %sub.id, error = %e, "schedule not run: its spec does not compile");
                        }
                        continue;
                    }
                },
            };
            out.push((sub.id.clone(), compiled, sub.dedup_window_s));
        }
        self.compiled.retain(|id, _| seen.contains(id));
        self.next_fire.retain(|id, _| seen.contains(id));
        out
    }

    /// One pass at `now_ms`: every schedule whose next fire time is due (or unknown) is planned from
    /// its stored cursor and its fires committed. Returns what it did and the earliest next fire
    /// time over all schedules. Errors: none; a schedule whose store calls fail is counted in
    /// `failed` and retried next pass.
    pub async fn pass(&mut self, engine: &Engine, now_ms: i64) -> (PassReport, Option<i64>) {
        use futures_util::StreamExt;
        let mut report = PassReport::default();
        let mut late = Vec::new();
        let due: Vec<_> = self
            .schedules(engine)
            .into_iter()
            .filter(|(id, _, _)| match self.next_fire.get(id) {
                Some(Some(next)) => *next <= now_ms,
                Some(None) => false, // past its end
                None => true,
            })
            .collect();
        // Due schedules are handled concurrently (bounded), so their commits share the store's
        // group commit (SQLite) or batches (PostgreSQL); each schedule's own ticks stay in order.
        let mut results = futures_util::stream::iter(due.into_iter().map(
            |(id, schedule, window_s)| async move {
                let mut part = PassReport::default();
                let r = one(engine, &id, &schedule, window_s, now_ms, &mut part).await;
                (id, schedule, part, r)
            },
        ))
        .buffer_unordered(PASS_CONCURRENCY);
        while let Some((id, schedule, part, r)) = results.next().await {
            report.merge(part);
            match r {
                Ok((next, cursor)) => {
                    if self.failing.remove(&id) {
                        tracing::info!(subscription = %id, "schedule passes again");
                    }
                    self.next_fire.insert(id.clone(), next);
                    let lag = lag_ms(&schedule, &id, &cursor, now_ms);
                    if lag > LATE_AFTER_MS {
                        late.push(Late {
                            subscription: id,
                            lag_ms: lag,
                        });
                    }
                }
                Err(e) => {
                    report.failed += 1;
                    if self.failing.insert(id.clone()) {
                        tracing::warn!(subscription = %id, error = %e, "schedule pass failed; its due ticks stay due and are retried every second");
                    }
                    // Retry in a second, not at once: a store outage must not spin the loop.
                    self.next_fire
                        .insert(id.clone(), Some(now_ms + RETRY_FAILED_MS));
                    // Lateness from the last known cursor: the tick has not fired.
                    if let Ok(Some(rec)) = engine.store.schedule_cursor(&id).await {
                        let lag = lag_ms(&schedule, &id, &rec.cursor, now_ms);
                        if lag > LATE_AFTER_MS {
                            late.push(Late {
                                subscription: id,
                                lag_ms: lag,
                            });
                        }
                    }
                }
            }
        }
        late.sort_by(|a, b| a.subscription.cmp(&b.subscription));
        metrics::gauge!("tb_schedules_late").set(late.len() as f64);
        metrics::gauge!("tb_schedule_lag_seconds")
            .set(late.iter().map(|l| l.lag_ms).max().unwrap_or(0) as f64 / 1000.0);
        *self.late.lock().unwrap_or_else(|p| p.into_inner()) = late;
        for (outcome, n) in [
            ("fired", report.fired),
            ("duplicate", report.duplicates),
            ("missed", report.missed),
            ("paused", report.paused),
            ("overlap_skipped", report.overlap_skipped),
        ] {
            if n > 0 {
                metrics::counter!("tb_schedule_ticks_total", "outcome" => outcome).increment(n);
            }
        }
        let next = self.next_fire.values().flatten().min().copied();
        (report, next)
    }
}

/// A schedule whose pass failed is tried again this many ms later.
pub const RETRY_FAILED_MS: i64 = 1_000;

/// A schedule holding a buffered tick (`overlap = buffer_one`) is looked at this often (ms) until
/// the previous run has ended.
pub const BUFFER_POLL_MS: i64 = 1_000;

/// At most this many ticks after the cursor are probed for an on-time commit whose cursor write was
/// lost, before a `run_once` catch-up is committed.
const CATCH_UP_PROBE: usize = 64;

/// Due schedules handled at once in a pass.
pub const PASS_CONCURRENCY: usize = 64;

impl PassReport {
    fn merge(&mut self, o: PassReport) {
        self.fired += o.fired;
        self.duplicates += o.duplicates;
        self.missed += o.missed;
        self.paused += o.paused;
        self.overlap_skipped += o.overlap_skipped;
        self.lost_races += o.lost_races;
        self.failed += o.failed;
        self.receipts.extend(o.receipts);
    }
}

/// At most this many compare-and-set retries per schedule per pass.
const CAS_TRIES: usize = 3;

/// One schedule's pass. Returns its next fire time and the cursor it left.
async fn one(
    engine: &Engine,
    id: &str,
    schedule: &Schedule,
    window_s: u64,
    now_ms: i64,
    report: &mut PassReport,
) -> Result<(Option<i64>, Cursor), TbError> {
    let mut seen = Cursor {
        last_nominal_ms: now_ms,
        ..Default::default()
    };
    for _ in 0..CAS_TRIES {
        let stored = engine.store.schedule_cursor(id).await.map_err(store_err)?;
        let (cursor, version) = match stored {
            Some(rec) => {
                seen = rec.cursor.clone();
                (rec.cursor, rec.version)
            }
            None => {
                // First sight: anchor just before now, so no tick before the schedule existed fires.
                let anchor = Cursor {
                    last_nominal_ms: now_ms - 1,
                    ..Default::default()
                };
                engine
                    .store
                    .put_schedule_cursor(id, anchor, None, now_ms)
                    .await
                    .map_err(store_err)?;
                continue; // re-read: ours or another loop's
            }
        };
        let state = engine.subscription_state(id);
        let active = !matches!(state, Some(SubscriptionState::Paused) | None);
        let previous_running = schedule.spec().overlap != Overlap::Allow
            && active
            && match &cursor.last_receipt {
                Some(r) => receipt_running(engine, r).await?,
                None => false,
            };
        let p = plan(
            schedule,
            id,
            &cursor,
            PassInput {
                now_ms,
                active,
                previous_running,
            },
        );
        let Some(mut next) = p.cursor.clone() else {
            return Ok((
                hint(schedule, id, &cursor, p.next_nominal_ms, now_ms),
                cursor,
            ));
        };
        if p.fire.iter().any(|f| f.catch_up_from.is_some()) {
            // A catch-up stands for ticks that may have been committed on time by a pass whose
            // cursor write was lost: find them, move the cursor past them, and plan again, so a
            // tick never fires once on time and once more as the catch-up.
            if let Some(repaired) = committed_ahead(engine, id, schedule, &cursor, now_ms).await? {
                if engine
                    .store
                    .put_schedule_cursor(id, repaired, Some(version), now_ms)
                    .await
                    .map_err(store_err)?
                {
                    continue;
                }
                report.lost_races += 1;
                continue;
            }
        }
        for fire in &p.fire {
            match fire_one(engine, id, schedule, window_s, fire, now_ms).await? {
                (receipt, true) => {
                    report.fired += 1;
                    report.receipts.push(receipt.clone());
                    next.last_receipt = Some(receipt);
                }
                (receipt, false) => {
                    report.duplicates += 1;
                    report.receipts.push(receipt.clone());
                    next.last_receipt = Some(receipt);
                }
            }
        }
        if engine
            .store
            .put_schedule_cursor(id, next.clone(), Some(version), now_ms)
            .await
            .map_err(store_err)?
        {
            report.missed += p.missed;
            report.paused += p.paused;
            report.overlap_skipped += p.overlap_skipped;
            return Ok((hint(schedule, id, &next, p.next_nominal_ms, now_ms), next));
        }
        report.lost_races += 1;
    }
    // Another loop keeps moving it: it is handling the schedule; look again next pass.
    Ok((Some(now_ms), seen))
}

/// When to look at the schedule again: the next tick's fire time, or within [`BUFFER_POLL_MS`]
/// while a buffered tick waits for the previous run to end.
fn hint(
    schedule: &Schedule,
    id: &str,
    cursor: &Cursor,
    nominal: Option<i64>,
    now_ms: i64,
) -> Option<i64> {
    let next = nominal.map(|n| schedule.fire_at(id, n));
    match (cursor.buffered_ms, next) {
        (Some(_), Some(n)) => Some(n.min(now_ms + BUFFER_POLL_MS)),
        (Some(_), None) => Some(now_ms + BUFFER_POLL_MS),
        (None, n) => n,
    }
}

/// The cursor moved past the ticks right after `cursor` that already have a receipt (an on-time
/// commit whose cursor write was lost), or `None` when the first of them has none.
async fn committed_ahead(
    engine: &Engine,
    id: &str,
    schedule: &Schedule,
    cursor: &Cursor,
    now_ms: i64,
) -> Result<Option<Cursor>, TbError> {
    let mut last = None;
    for n in schedule.upcoming(cursor.last_nominal_ms, CATCH_UP_PROBE) {
        if n > now_ms {
            break;
        }
        let key = dedup_key(id, &Fire::on_time(n).dedup_id());
        match engine
            .store
            .find_duplicate(id, &key, now_ms)
            .await
            .map_err(store_err)?
        {
            Some(tb_store::IngestOutcome::Duplicate { receipt_id, .. }) => {
                last = Some((n, receipt_id))
            }
            _ => break,
        }
    }
    Ok(last.map(|(n, receipt)| Cursor {
        last_nominal_ms: n,
        last_receipt: Some(receipt),
        ..cursor.clone()
    }))
}

/// Whether the work of `receipt` is still going on: a delivery not yet terminal, or a run it started
/// that has not ended.
async fn receipt_running(engine: &Engine, receipt: &str) -> Result<bool, TbError> {
    let deliveries = engine
        .store
        .deliveries_of_receipt(receipt)
        .await
        .map_err(store_err)?;
    for d in deliveries {
        if !d.state.is_terminal() {
            return Ok(true);
        }
        if let Some(run) = &d.run_id {
            match engine.store.get_run(run).await {
                Ok(r) if !r.status.is_terminal() => return Ok(true),
                Ok(_) => {}
                Err(tb_store::StoreError::NotFound { .. }) => {}
                Err(e) => return Err(store_err(e)),
            }
        }
    }
    Ok(false)
}

/// Commits one tick through [`accept`]. Returns its receipt id and whether it was new (false: a
/// duplicate of another loop's commit).
async fn fire_one(
    engine: &Engine,
    id: &str,
    schedule: &Schedule,
    window_s: u64,
    fire: &Fire,
    now_ms: i64,
) -> Result<(String, bool), TbError> {
    let nominal = utc_rfc3339(fire.nominal_ms);
    let fired_at = utc_rfc3339(now_ms);
    let catch_up = fire.catch_up_from.is_some();
    let mut event = NormalizedEvent {
        event: TICK_EVENT.into(),
        action: Some(TICK_ACTION.into()),
        fields: Default::default(),
    };
    event
        .fields
        .insert("schedule.nominal_time".into(), nominal.clone().into());
    event
        .fields
        .insert("schedule.fired_at".into(), fired_at.clone().into());
    event
        .fields
        .insert("schedule.catch_up".into(), catch_up.into());
    event
        .fields
        .insert("schedule.missed".into(), fire.missed.into());
    let spec = schedule.spec();
    let body = serde_json::json!({
        "scheduleId": id,
        "nominalTime": nominal,
        "nominalTimeLocal": schedule.local_rfc3339(fire.nominal_ms),
        "firedAt": fired_at,
        "timezone": spec.timezone,
        "cron": spec.cron,
        "catchUp": catch_up,
        "missed": fire.missed,
    });
    let dedup_id = fire.dedup_id();
    let inbound = Inbound {
        source: ReceiptSource::Schedule,
        subscription: id.to_string(),
        counter: Some("schedule"),
        provider_event_id: Some(dedup_id.clone()),
        event_type: event.event_type(),
        normalized: serde_json::to_value(&event).unwrap_or_default(),
        body: Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        content_type: Some("application/json".into()),
        received_at: now_ms,
        dedup: Some(Dedup {
            key: dedup_key(id, &dedup_id),
            // At least a day: far longer than two loops can disagree about one cursor.
            window_ms: window_s.max(86_400).saturating_mul(1000) as i64,
            same_body: false,
        }),
        rate_limit_per_min: None,
        routing: Routing::Route(event),
        capability: None,
        target_run: None,
        trace_parent: None,
    };
    match accept(engine, inbound).await {
        Ok(Accepted::Answer(IngestAnswer::Duplicate { receipt_id, .. })) => Ok((receipt_id, false)),
        Ok(Accepted::Answer(
            IngestAnswer::Accepted { receipt_id, .. }
            | IngestAnswer::Unmatched { receipt_id }
            | IngestAnswer::DeadLettered { receipt_id, .. },
        ))
        | Ok(Accepted::Recorded { receipt_id }) => Ok((receipt_id, true)),
        Err(e) => Err(e),
    }
}

/// The scheduler task: a [`Scheduler::pass`] now, then after the earliest next fire time (at most
/// [`MAX_SLEEP`] later), until `stop` turns true. Spawn it once per engine whose role runs workers.
pub async fn run(engine: Arc<Engine>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut s = Scheduler::new(engine.schedules_late.clone());
    loop {
        let now = clock::now_ms();
        let (_, next) = s.pass(&engine, now).await;
        let wait = match next {
            Some(n) if n > now => Duration::from_millis((n - now) as u64).min(MAX_SLEEP),
            Some(_) => Duration::from_millis(10),
            None => MAX_SLEEP,
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return; },
        }
    }
}

/// `GET /v1/schedules/{id}/next`: the next `count` fire times (1 ..= 100) after now, as
/// `(nominal UTC, local)` RFC 3339 pairs. Errors: `validation_error` for a count outside 1 ..= 100.
pub fn preview(
    schedule: &Schedule,
    now_ms: i64,
    count: usize,
) -> Result<Vec<(String, String)>, TbError> {
    if !(1..=100).contains(&count) {
        return Err(TbError::new(
            ErrorCode::ValidationError,
            "count must be 1 ..= 100",
        ));
    }
    Ok(schedule
        .upcoming(now_ms, count)
        .into_iter()
        .map(|n| (utc_rfc3339(n), schedule.local_rfc3339(n)))
        .collect())
}
