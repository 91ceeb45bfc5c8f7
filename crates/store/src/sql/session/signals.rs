//! Signals on SQLite: the per-run FIFO mailbox, dedup by `signalId`, overflow policy, large payloads.

use super::*;
use crate::p;
use crate::sql::{Db, Dialect, Row};

pub(super) fn mailbox_of(c: &dyn Db, run_id: &str) -> StoreResult<MailboxPolicy> {
    let m: Option<String> = c
        .row("SELECT mailbox FROM runs WHERE id = ?1", p![run_id], |r| {
            r.get(0)
        })?
        .ok_or_else(no_row)?;
    Ok(m.and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default())
}

/// Raises a signal on a run (signals-and-connectors §5.2): a repeated `signalId` is recorded
/// (`tb.signal.duplicate`) and suppressed; a full mailbox follows its policy; the signal is buffered in
/// FIFO order (`tb.signal.buffered`), wakes the run with a turn when `wake`, and may resolve the armed
/// wait at once. Errors: `NotFound`; `Rejected(target_terminal | signal_buffer_full)`.
///
/// Every raise, whatever its path (API, webhook delivery, capability URL), comes through here, so this
/// is where `tb_signals_total{outcome, source}` is counted (issue #9): `outcome` is `queued`,
/// `queued_with_drop`, `duplicate`, `rejected_full` or `refused` (terminal run, conflict, unknown run).
pub(crate) fn raise_signal(
    c: &dyn Db,
    run_id: &str,
    s: &NewSignal,
    now: i64,
) -> StoreResult<RaiseOutcome> {
    let out = raise(c, run_id, s, now);
    let outcome = match &out {
        Ok(o) if o.status == "duplicate" => "duplicate",
        Ok(o) if !o.dropped.is_empty() => "queued_with_drop",
        Ok(_) => "queued",
        Err(e) if e.code() == ErrorCode::SignalBufferFull => "rejected_full",
        Err(_) => "refused",
    };
    metrics::counter!("tb_signals_total", "outcome" => outcome, "source" => s.source.kind.as_str())
        .increment(1);
    out
}

fn raise(c: &dyn Db, run_id: &str, s: &NewSignal, now: i64) -> StoreResult<RaiseOutcome> {
    live_run(c, run_id)?;
    let existing: Option<String> = c.row(
        "SELECT envelope FROM signals WHERE run_id = ?1 AND signal_id = ?2",
        p![run_id, s.signal_id],
        |r| r.get(0),
    )?;
    if let Some(env) = existing {
        let first = json_col(Some(env.clone())).unwrap_or(Value::Null);
        if !same_signal(c, run_id, &first, s)? {
            return Err(StoreError::Conflict(
                "this signalId was already used on this run for a different signal (name or data)"
                    .into(),
            ));
        }
        append_event(
            c,
            run_id,
            "tb.signal.duplicate",
            &json!({"signalId": s.signal_id, "name": s.name}),
            now,
        )?;
        return Ok(RaiseOutcome {
            status: "duplicate",
            signal: json_col(Some(env)).unwrap_or(Value::Null),
            consumed_by: None,
            dropped: Vec::new(),
        });
    }
    let buffered: u32 = c
        .row(
            "SELECT COUNT(*) FROM signals WHERE run_id = ?1 AND state = 'buffered'",
            p![run_id],
            |r| r.get(0),
        )?
        .ok_or_else(no_row)?;
    let mut dropped = Vec::new();
    match admit(mailbox_of(c, run_id)?, buffered) {
        Admit::Buffer => {}
        Admit::Reject => {
            return Err(rejected(
                ErrorCode::SignalBufferFull,
                format!("the run's signal mailbox is full ({buffered} buffered) and its overflow policy is reject; retry after it drains"),
            ))
        }
        Admit::DropOldest(n) => {
            let rows = c.rows(
                "UPDATE signals SET state = 'dropped', settled_at = ?3 WHERE run_id = ?1 AND seq IN \
                 (SELECT seq FROM signals WHERE run_id = ?1 AND state = 'buffered' ORDER BY seq LIMIT ?2) \
                 RETURNING signal_id, name, seq, delivery_id",
                p![run_id, n, now],
                |r| {
                    Ok((
                        r.get::<String>(0)?,
                        r.get::<String>(1)?,
                        r.get::<i64>(2)?,
                        r.get::<Option<String>>(3)?,
                    ))
                },
            )?;
            for (id, name, seq, delivery) in rows {
                append_event(
                    c,
                    run_id,
                    "tb.signal.dropped",
                    &json!({"signalId": id, "name": name, "seq": seq, "reason": "mailbox_full"}),
                    now,
                )?;
                if let Some(d) = delivery {
                    // Its receipt can no longer be consumed: it ends `expired`.
                    c.exec("UPDATE receipts SET state = 'expired', updated_at = ?2 WHERE id = (SELECT receipt_id FROM deliveries WHERE id = ?1)", p![d, now])?;
                }
                dropped.push(id);
            }
        }
    }
    let (data, payload_ref) = match &s.data {
        DataPlacement::None => (None, None),
        DataPlacement::Inline(v) => (Some(v.clone()), None),
        DataPlacement::Reference(bytes) => {
            let r = format!("sigp_{}", &new_id(IdKind::Signal)[4..]);
            c.exec(
                "INSERT INTO signal_payloads (ref, run_id, data, created_at) VALUES (?1, ?2, ?3, ?4)", p![r, run_id, bytes, now])?;
            (None, Some(r))
        }
    };
    let env = SessionSignalV1 {
        version: 1,
        signal_id: s.signal_id.clone(),
        name: s.name.clone(),
        source: s.source.clone(),
        raised_at: rfc3339(now),
        data,
        payload_ref,
        wake: s.wake,
    };
    let env_json = serde_json::to_value(&env).expect("serializable");
    let seq: i64 = c
        .row(
            "INSERT INTO signals (run_id, seq, signal_id, name, envelope, state, delivery_id, raised_at) \
             VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM signals WHERE run_id = ?1), ?2, ?3, ?4, 'buffered', ?5, ?6) \
             RETURNING seq", p![run_id, s.signal_id, s.name, env_json.to_string(), s.delivery_id, now], |r| r.get(0),)?.ok_or_else(no_row)?;
    append_event(
        c,
        run_id,
        "tb.signal.buffered",
        &json!({"signalId": s.signal_id, "name": s.name, "seq": seq, "source": s.source.kind, "wake": s.wake}),
        now,
    )?;
    if s.wake {
        insert_turn(
            c,
            run_id,
            TurnKind::Signal,
            &turn::signal_content(&env_json),
            s.delivery_id.as_deref(),
            false,
            now,
        )?;
    }
    resolve_step(c, run_id, now, false)?;
    let consumed_by: Option<String> = c
        .row(
            "SELECT consumed_by FROM signals WHERE run_id = ?1 AND seq = ?2",
            p![run_id, seq],
            |r| r.get(0),
        )?
        .ok_or_else(no_row)?;
    Ok(RaiseOutcome {
        status: "queued",
        signal: env_json,
        consumed_by,
        dropped,
    })
}

/// Whether a repeated `signalId` carries the same name and data as the stored envelope (then it is a
/// duplicate; otherwise a conflict).
pub(super) fn same_signal(
    c: &dyn Db,
    run_id: &str,
    first: &Value,
    s: &NewSignal,
) -> StoreResult<bool> {
    if first["name"] != s.name.as_str() {
        return Ok(false);
    }
    Ok(
        match (&s.data, first.get("payloadRef").and_then(Value::as_str)) {
            (DataPlacement::None, None) => first.get("data").is_none(),
            (DataPlacement::Inline(v), None) => first.get("data") == Some(v),
            (DataPlacement::Reference(bytes), Some(r)) => signal_payload(c, run_id, r)? == *bytes,
            _ => false,
        },
    )
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
/// `before` (ms), with their large payloads. The newest signal of each run is kept so arrival numbers
/// (`seq`) are never reused. Returns how many were deleted.
pub(crate) fn sweep_signals(c: &dyn Db, before: i64, batch: u32) -> StoreResult<u64> {
    let doomed: Vec<(String, i64, Option<String>)> = c.rows(
        match c.dialect() {
            Dialect::Sqlite => {
                "SELECT run_id, seq, json_extract(envelope, '$.payloadRef') FROM signals s \
             WHERE state <> 'buffered' AND settled_at IS NOT NULL AND settled_at < ?1 \
             AND seq < (SELECT MAX(seq) FROM signals m WHERE m.run_id = s.run_id) LIMIT ?2"
            }
            Dialect::Postgres => {
                "SELECT run_id, seq, envelope::jsonb ->> 'payloadRef' FROM signals s \
             WHERE state <> 'buffered' AND settled_at IS NOT NULL AND settled_at < ?1 \
             AND seq < (SELECT MAX(seq) FROM signals m WHERE m.run_id = s.run_id) LIMIT ?2"
            }
        },
        p![before, batch],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
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
    .ok_or_else(|| StoreError::NotFound("signal payload".into()))
}
