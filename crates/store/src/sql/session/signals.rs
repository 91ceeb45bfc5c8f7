//! Signals: raising one on a run's FIFO mailbox (rule: `tb_core::signal::raise`), reading the mailbox,
//! large payloads, and the retention sweep of settled signals.

use super::*;
use crate::p;
use crate::sql::{Db, Row};
use tb_core::signal::{self, IncomingSignal, RaiseStatus, Raised};

/// Raises a signal on a run (signals-and-connectors §5.2; rule: `tb_core::signal::raise`): locks the run,
/// loads its snapshot and the signal already stored under the same `signalId`, and applies what the rule
/// returned (duplicate, drop-oldest, the buffered signal at the run's `next_signal_seq`, a wake turn, a
/// wait step). Errors: `NotFound("run")`; `Rejected(target_terminal | signal_buffer_full)`; `Conflict`
/// (same `signalId`, different signal).
///
/// Every raise, whatever its path (API, webhook delivery, capability URL), comes through here, so this
/// is where `tb_signals_total{outcome, source}` is counted (labels from
/// `tb_core::signal::outcome_label`).
pub(crate) fn raise_signal(
    c: &dyn Db,
    run_id: &str,
    s: &NewSignal,
    now: i64,
) -> StoreResult<RaiseOutcome> {
    raise_counted(c, run_id, s, now).map(|(o, _)| o)
}

/// [`raise_signal`] for a delivery's effect: also whether the raise consumed the raising delivery's
/// effect, as its writes say: a duplicate settles it (`Raised::settles_delivery`: consumed, or still
/// buffered, under its first delivery), and so does a `ConsumeDelivery` of it (a wait took the signal
/// at once).
pub(super) fn raise_for_delivery(
    c: &dyn Db,
    run_id: &str,
    s: &NewSignal,
    now: i64,
) -> StoreResult<bool> {
    raise_counted(c, run_id, s, now).map(|(_, consumed)| consumed)
}

fn raise_counted(
    c: &dyn Db,
    run_id: &str,
    s: &NewSignal,
    now: i64,
) -> StoreResult<(RaiseOutcome, bool)> {
    let out = raise(c, run_id, s, now);
    let outcome = signal::outcome_label(out.as_ref().map(|(r, ..)| r).map_err(|e| e.code()));
    crate::after_commit::record(crate::after_commit::Fact::Signal {
        outcome,
        source: s.source.kind.as_str(),
    });
    let (raised, answer, applied) = out?;
    let consumed = raised.settles_delivery()
        || s.delivery_id
            .as_ref()
            .is_some_and(|d| applied.consumed.contains(d));
    Ok((answer, consumed))
}

fn raise(
    c: &dyn Db,
    run_id: &str,
    s: &NewSignal,
    now: i64,
) -> StoreResult<(Raised, RaiseOutcome, apply::Applied)> {
    let snap = snapshot::load(c, run_id, None)?;
    let first = snapshot::first_signal(c, run_id, &s.signal_id)?;
    let incoming = IncomingSignal {
        signal_id: &s.signal_id,
        name: &s.name,
        source: s.source.kind,
        data: &s.data,
        wake: s.wake,
        delivery_id: s.delivery_id.as_deref(),
    };
    let raised = with_ctx(now, |ctx| {
        signal::raise(&snap, &incoming, first.as_ref().map(|(f, _)| f), ctx)
    })
    .map_err(refused)?;
    let mut applied = apply::apply(c, run_id, snap.counters, &raised.writes, Some(s), now)?;
    let (status, envelope) = match raised.status {
        RaiseStatus::Duplicate => ("duplicate", first.map(|(_, env)| env)),
        RaiseStatus::Queued { .. } => ("queued", applied.envelope.take()),
    };
    let outcome = RaiseOutcome {
        status,
        signal: envelope.unwrap_or(Value::Null),
        consumed_by: raised.consumed_by.clone(),
        dropped: raised.dropped.clone(),
    };
    Ok((raised, outcome, applied))
}

pub(super) fn signal_row(r: &Row) -> StoreResult<SignalRecord> {
    Ok(SignalRecord {
        run_id: r.get(0)?,
        seq: r.get(1)?,
        state: r.get(2)?,
        signal: json_col(r.get(3)?).unwrap_or(Value::Null),
        consumed_by: r.get(4)?,
        settled_at: r.get(5)?,
    })
}

/// One page of a run's mailbox, newest first: signals with `seq < before` (all when `None`), at most
/// `limit`, plus the count of buffered signals. Errors: `NotFound` (no such run).
pub(crate) fn list_signals(
    c: &dyn Db,
    run_id: &str,
    before: Option<u64>,
    limit: u32,
) -> StoreResult<SignalPage> {
    read::get_run(c, run_id)?;
    let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
    let signals = c.rows(
        "SELECT run_id, seq, state, envelope, consumed_by, settled_at FROM signals \
         WHERE run_id = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3",
        p![run_id, before, limit],
        signal_row,
    )?;
    let buffered: i64 = c
        .row(
            "SELECT COUNT(*) FROM signals WHERE run_id = ?1 AND state = 'buffered'",
            p![run_id],
            |r| r.get(0),
        )?
        .ok_or_else(no_row)?;
    Ok(SignalPage {
        signals,
        buffered: buffered as u64,
    })
}

/// Deletes at most `batch` settled signal records (consumed, dropped or expired) settled before
/// `before` (ms), with their large payloads. Arrival numbers (`seq`) come from the run's
/// `next_signal_seq` counter, so deleting even a run's newest signal never lets a number be reused.
/// Returns how many were deleted.
pub(crate) fn sweep_signals(c: &dyn Db, before: i64, batch: u32) -> StoreResult<u64> {
    let doomed: Vec<(String, i64, Option<String>)> = c.rows(
        "SELECT run_id, seq, envelope FROM signals \
         WHERE state <> 'buffered' AND settled_at IS NOT NULL AND settled_at < ?1 LIMIT ?2",
        p![before, batch],
        |r| {
            let env = read::json(r.get(2)?);
            let payload = env
                .get("payloadRef")
                .and_then(Value::as_str)
                .map(String::from);
            Ok((r.get(0)?, r.get(1)?, payload))
        },
    )?;
    for (run, seq, payload) in &doomed {
        if let Some(p) = payload {
            c.exec(
                "DELETE FROM signal_payloads WHERE ref = ?1 AND run_id = ?2",
                p![p, run],
            )?;
        }
        c.exec(
            "DELETE FROM signals WHERE run_id = ?1 AND seq = ?2",
            p![run, seq],
        )?;
    }
    Ok(doomed.len() as u64)
}

pub(crate) fn signal_payload(c: &dyn Db, run_id: &str, r: &str) -> StoreResult<Vec<u8>> {
    c.row(
        "SELECT data FROM signal_payloads WHERE ref = ?1 AND run_id = ?2",
        p![r, run_id],
        |r| r.get(0),
    )?
    .ok_or_else(|| StoreError::not_found(RecordKind::SignalPayload))
}
