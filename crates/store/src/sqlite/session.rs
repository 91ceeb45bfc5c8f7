//! Sessions on SQLite: signals (per-run FIFO mailbox), waits and their resolution, turns, coalescing and
//! capability endpoints. Every function runs inside the writer's batch transaction (its own savepoint);
//! an `Err` rolls back just that function's writes. The resolution RULE lives in `tb_core::wait`; this
//! file only gathers the candidates and applies the outcome.

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Value};
use tb_core::ids::{new_id, IdKind};
use tb_core::run::RunStatus;
use tb_core::signal::{admit, Admit, DataPlacement, MailboxPolicy, SessionSignalV1};
use tb_core::turn::{self, TurnKind, TurnState};
use tb_core::wait::{self, Candidates, Resolution, WaitKind, WaitSpec, WaitState, WinnerKind};
use tb_core::ErrorCode;

use super::read::{self, db};
use super::write;
use crate::model::*;
use crate::session::*;
use crate::{StoreError, StoreResult};

fn rejected(code: ErrorCode, message: impl Into<String>) -> StoreError {
    StoreError::Rejected {
        code,
        message: message.into(),
    }
}

fn json_col(s: Option<String>) -> Option<Value> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

/// ISO-8601 UTC with milliseconds.
fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// The run, which must exist and not be terminal. Errors: `NotFound`; `Rejected(target_terminal)`.
fn live_run(c: &Connection, run_id: &str) -> StoreResult<RunRecord> {
    let run = read::get_run(c, run_id)?;
    if run.status.is_terminal() {
        return Err(rejected(
            ErrorCode::TargetTerminal,
            format!("the run has ended ({})", run.status.as_str()),
        ));
    }
    Ok(run)
}

/// Appends a content-free event to a run's log at its next sequence.
pub(crate) fn append_event(
    c: &Connection,
    run_id: &str,
    ty: &str,
    payload: &Value,
    now: i64,
) -> StoreResult<()> {
    let seq: i64 = c
        .prepare_cached(
            "UPDATE runs SET next_sequence = next_sequence + 1, updated_at = ?2 WHERE id = ?1 RETURNING next_sequence - 1",
        )
        .map_err(db)?
        .query_row(params![run_id, now], |r| r.get(0))
        .map_err(db)?;
    write::insert_run_event(c, run_id, seq as u64, ty, payload, None, now)
}

fn set_status(
    c: &Connection,
    run_id: &str,
    status: RunStatus,
    reason: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    c.prepare_cached(
        "UPDATE runs SET status = ?2, wait_reason = ?3, updated_at = ?4 WHERE id = ?1",
    )
    .map_err(db)?
    .execute(params![run_id, status.as_str(), reason, now])
    .map_err(db)?;
    Ok(())
}

/// Marks a delivery's effect consumed and settles its receipt.
fn consume_delivery(c: &Connection, delivery_id: Option<&str>, now: i64) -> StoreResult<()> {
    let Some(d) = delivery_id else { return Ok(()) };
    let n = c
        .prepare_cached("UPDATE deliveries SET consumed_at = ?2 WHERE id = ?1 AND consumed_at IS NULL RETURNING receipt_id")
        .map_err(db)?
        .query_row(params![d, now], |r| r.get::<_, String>(0))
        .optional()
        .map_err(db)?;
    if let Some(receipt) = n {
        write::settle_receipt(c, &receipt, now)?;
    }
    Ok(())
}

// --- turns ------------------------------------------------------------------------------------------

fn insert_turn(
    c: &Connection,
    run_id: &str,
    kind: TurnKind,
    content: &Value,
    delivery_id: Option<&str>,
    user_input: bool,
    now: i64,
) -> StoreResult<String> {
    let id = new_id(IdKind::Turn);
    c.prepare_cached(
        "INSERT INTO turns (id, run_id, seq, kind, content, state, delivery_id, user_input, created_at) \
         VALUES (?1, ?2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM turns WHERE run_id = ?2), ?3, ?4, 'queued', ?5, ?6, ?7)",
    )
    .map_err(db)?
    .execute(params![id, run_id, kind.as_str(), content.to_string(), delivery_id, user_input, now])
    .map_err(db)?;
    append_event(
        c,
        run_id,
        "tb.turn.queued",
        &json!({"turnId": id, "kind": kind.as_str()}),
        now,
    )?;
    Ok(id)
}

const TURN_COLS: &str =
    "id, run_id, seq, kind, content, state, lease_until, claims, created_at, acked_at";

fn turn_row(r: &Row) -> rusqlite::Result<TurnRecord> {
    let kind: String = r.get(3)?;
    let state: String = r.get(5)?;
    Ok(TurnRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        seq: r.get(2)?,
        kind: TurnKind::parse(&kind).unwrap_or(TurnKind::Prompt),
        content: json_col(r.get(4)?).unwrap_or(Value::Null),
        state: TurnState::parse(&state).unwrap_or(TurnState::Queued),
        lease_until: r.get(6)?,
        claims: r.get(7)?,
        created_at: r.get(8)?,
        acked_at: r.get(9)?,
    })
}

/// Enqueues a prompt as accepted user input, then lets it interrupt or win the run's armed wait.
pub(crate) fn enqueue_prompt(
    c: &Connection,
    run_id: &str,
    p: &NewPrompt,
    now: i64,
) -> StoreResult<TurnRecord> {
    live_run(c, run_id)?;
    let content = turn::prompt_content(&p.text, &p.variables, &p.from);
    let id = insert_turn(
        c,
        run_id,
        TurnKind::Prompt,
        &content,
        p.delivery_id.as_deref(),
        true,
        now,
    )?;
    resolve_step(c, run_id, now, false)?;
    get_turn(c, run_id, &id)
}

pub(crate) fn get_turn(c: &Connection, run_id: &str, id: &str) -> StoreResult<TurnRecord> {
    c.prepare_cached(&format!(
        "SELECT {TURN_COLS} FROM turns WHERE id = ?1 AND run_id = ?2"
    ))
    .map_err(db)?
    .query_row(params![id, run_id], turn_row)
    .optional()
    .map_err(db)?
    .ok_or_else(|| StoreError::NotFound("turn".into()))
}

pub(crate) fn list_turns(c: &Connection, run_id: &str) -> StoreResult<Vec<TurnRecord>> {
    read::get_run(c, run_id)?;
    let mut st = c
        .prepare_cached(&format!(
            "SELECT {TURN_COLS} FROM turns WHERE run_id = ?1 ORDER BY seq"
        ))
        .map_err(db)?;
    let rows = st.query_map([run_id], turn_row).map_err(db)?;
    rows.collect::<Result<_, _>>().map_err(db)
}

/// Claims the run's next turn in order: one turn at a time, so a turn still leased (lease not lapsed)
/// blocks the next. A lapsed lease is redelivered (`claims` grows). `None` when nothing is claimable.
pub(crate) fn claim_turn(
    c: &Connection,
    run_id: &str,
    lease_ms: u64,
    now: i64,
) -> StoreResult<Option<TurnRecord>> {
    read::get_run(c, run_id)?;
    let next: Option<(String, String, Option<i64>)> = c
        .prepare_cached(
            "SELECT id, state, lease_until FROM turns WHERE run_id = ?1 AND state != 'acked' ORDER BY seq LIMIT 1",
        )
        .map_err(db)?
        .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()
        .map_err(db)?;
    let Some((id, state, lease_until)) = next else {
        return Ok(None);
    };
    if state == "leased" && lease_until.is_some_and(|l| l > now) {
        return Ok(None);
    }
    c.prepare_cached(
        "UPDATE turns SET state = 'leased', lease_until = ?2, claims = claims + 1 WHERE id = ?1",
    )
    .map_err(db)?
    .execute(params![id, now + lease_ms as i64])
    .map_err(db)?;
    get_turn(c, run_id, &id).map(Some)
}

/// Acknowledges a claimed turn: its prompt or wake delivery counts as consumed, and a wait it
/// interrupted re-arms with its original absolute deadline (then resolves at once if it can).
/// Errors: `NotFound`; `Conflict` when the turn is not leased (never claimed, or already acked).
pub(crate) fn ack_turn(
    c: &Connection,
    run_id: &str,
    turn_id: &str,
    now: i64,
) -> StoreResult<TurnRecord> {
    let t = get_turn(c, run_id, turn_id)?;
    if t.state != TurnState::Leased {
        return Err(StoreError::Conflict(format!(
            "only a claimed turn can be acknowledged; this one is {}",
            t.state.as_str()
        )));
    }
    let delivery: Option<String> = c
        .prepare_cached("UPDATE turns SET state = 'acked', acked_at = ?2, lease_until = NULL WHERE id = ?1 RETURNING delivery_id")
        .map_err(db)?
        .query_row(params![turn_id, now], |r| r.get(0))
        .map_err(db)?;
    append_event(
        c,
        run_id,
        "tb.turn.acked",
        &json!({"turnId": turn_id, "kind": t.kind.as_str()}),
        now,
    )?;
    consume_delivery(c, delivery.as_deref(), now)?;
    // Re-arm a wait this turn interrupted.
    let rearm: Option<(String, String)> = c
        .prepare_cached("UPDATE waits SET interrupted_by = NULL WHERE run_id = ?1 AND state = 'armed' AND interrupted_by = ?2 RETURNING id, spec")
        .map_err(db)?
        .query_row(params![run_id, turn_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(db)?;
    if let Some((wait_id, spec)) = rearm {
        let spec: WaitSpec =
            serde_json::from_str(&spec).map_err(|e| StoreError::Database(e.to_string()))?;
        let run = read::get_run(c, run_id)?;
        if !run.status.is_terminal() {
            set_status(
                c,
                run_id,
                RunStatus::WaitingExternal,
                Some(&spec.reason),
                now,
            )?;
        }
        append_event(
            c,
            run_id,
            "tb.wait.resumed",
            &json!({"waitId": wait_id}),
            now,
        )?;
        resolve_step(c, run_id, now, false)?;
    }
    get_turn(c, run_id, turn_id)
}

// --- signals ----------------------------------------------------------------------------------------

fn mailbox_of(c: &Connection, run_id: &str) -> StoreResult<MailboxPolicy> {
    let m: Option<String> = c
        .prepare_cached("SELECT mailbox FROM runs WHERE id = ?1")
        .map_err(db)?
        .query_row([run_id], |r| r.get(0))
        .map_err(db)?;
    Ok(m.and_then(|m| serde_json::from_str(&m).ok())
        .unwrap_or_default())
}

/// Raises a signal on a run (signals-and-connectors §5.2): a repeated `signalId` is recorded
/// (`tb.signal.duplicate`) and suppressed; a full mailbox follows its policy; the signal is buffered in
/// FIFO order (`tb.signal.buffered`), wakes the run with a turn when `wake`, and may resolve the armed
/// wait at once. Errors: `NotFound`; `Rejected(target_terminal | signal_buffer_full)`.
pub(crate) fn raise_signal(
    c: &Connection,
    run_id: &str,
    s: &NewSignal,
    now: i64,
) -> StoreResult<RaiseOutcome> {
    live_run(c, run_id)?;
    let existing: Option<String> = c
        .prepare_cached("SELECT envelope FROM signals WHERE run_id = ?1 AND signal_id = ?2")
        .map_err(db)?
        .query_row(params![run_id, s.signal_id], |r| r.get(0))
        .optional()
        .map_err(db)?;
    if let Some(env) = existing {
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
        .prepare_cached("SELECT COUNT(*) FROM signals WHERE run_id = ?1 AND state = 'buffered'")
        .map_err(db)?
        .query_row([run_id], |r| r.get(0))
        .map_err(db)?;
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
            let mut st = c
                .prepare_cached(
                    "UPDATE signals SET state = 'dropped', settled_at = ?3 WHERE rowid IN \
                     (SELECT rowid FROM signals WHERE run_id = ?1 AND state = 'buffered' ORDER BY seq LIMIT ?2) \
                     RETURNING signal_id, name, seq, delivery_id",
                )
                .map_err(db)?;
            let rows = st
                .query_map(params![run_id, n, now], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<String>>(3)?,
                    ))
                })
                .map_err(db)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(db)?;
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
                    c.prepare_cached("UPDATE receipts SET state = 'expired', updated_at = ?2 WHERE id = (SELECT receipt_id FROM deliveries WHERE id = ?1)")
                        .map_err(db)?
                        .execute(params![d, now])
                        .map_err(db)?;
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
            c.prepare_cached(
                "INSERT INTO signal_payloads (ref, run_id, data, created_at) VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(db)?
            .execute(params![r, run_id, bytes, now])
            .map_err(db)?;
            (None, Some(r))
        }
    };
    let env = SessionSignalV1 {
        version: 1,
        signal_id: s.signal_id.clone(),
        name: s.name.clone(),
        source: s.source.clone(),
        raised_at: iso(now),
        data,
        payload_ref,
        wake: s.wake,
    };
    let env_json = serde_json::to_value(&env).expect("serializable");
    let seq: i64 = c
        .prepare_cached(
            "INSERT INTO signals (run_id, seq, signal_id, name, envelope, state, delivery_id, raised_at) \
             VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM signals WHERE run_id = ?1), ?2, ?3, ?4, 'buffered', ?5, ?6) \
             RETURNING seq",
        )
        .map_err(db)?
        .query_row(
            params![run_id, s.signal_id, s.name, env_json.to_string(), s.delivery_id, now],
            |r| r.get(0),
        )
        .map_err(db)?;
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
        .prepare_cached("SELECT consumed_by FROM signals WHERE run_id = ?1 AND seq = ?2")
        .map_err(db)?
        .query_row(params![run_id, seq], |r| r.get(0))
        .map_err(db)?;
    Ok(RaiseOutcome {
        status: "queued",
        signal: env_json,
        consumed_by,
        dropped,
    })
}

fn signal_row(r: &Row) -> rusqlite::Result<SignalRecord> {
    Ok(SignalRecord {
        run_id: r.get(0)?,
        seq: r.get(1)?,
        state: r.get(2)?,
        signal: json_col(r.get(3)?).unwrap_or(Value::Null),
        consumed_by: r.get(4)?,
        settled_at: r.get(5)?,
    })
}

pub(crate) fn list_signals(c: &Connection, run_id: &str) -> StoreResult<Vec<SignalRecord>> {
    read::get_run(c, run_id)?;
    let mut st = c
        .prepare_cached("SELECT run_id, seq, state, envelope, consumed_by, settled_at FROM signals WHERE run_id = ?1 ORDER BY seq")
        .map_err(db)?;
    let rows = st.query_map([run_id], signal_row).map_err(db)?;
    rows.collect::<Result<_, _>>().map_err(db)
}

pub(crate) fn signal_payload(c: &Connection, run_id: &str, r: &str) -> StoreResult<Vec<u8>> {
    c.prepare_cached("SELECT data FROM signal_payloads WHERE ref = ?1 AND run_id = ?2")
        .map_err(db)?
        .query_row(params![r, run_id], |r| r.get(0))
        .optional()
        .map_err(db)?
        .ok_or_else(|| StoreError::NotFound("signal payload".into()))
}

// --- waits ------------------------------------------------------------------------------------------

const WAIT_COLS: &str =
    "id, run_id, spec, deadline, state, interrupted_by, winner, losers, created_at, settled_at";

fn wait_row(r: &Row) -> rusqlite::Result<WaitRecord> {
    let spec: String = r.get(2)?;
    let state: String = r.get(4)?;
    Ok(WaitRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        spec: serde_json::from_str(&spec).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, e.into())
        })?,
        deadline: r.get(3)?,
        state: WaitState::parse(&state).unwrap_or(WaitState::Armed),
        interrupted_by: r.get(5)?,
        winner: json_col(r.get(6)?),
        losers: json_col(r.get(7)?).unwrap_or_else(|| json!([])),
        created_at: r.get(8)?,
        settled_at: r.get(9)?,
    })
}

pub(crate) fn get_wait(c: &Connection, run_id: &str, id: &str) -> StoreResult<WaitRecord> {
    c.prepare_cached(&format!(
        "SELECT {WAIT_COLS} FROM waits WHERE id = ?1 AND run_id = ?2"
    ))
    .map_err(db)?
    .query_row(params![id, run_id], wait_row)
    .optional()
    .map_err(db)?
    .ok_or_else(|| StoreError::NotFound("wait".into()))
}

pub(crate) fn list_waits(c: &Connection, run_id: &str) -> StoreResult<Vec<WaitRecord>> {
    read::get_run(c, run_id)?;
    let mut st = c
        .prepare_cached(&format!(
            "SELECT {WAIT_COLS} FROM waits WHERE run_id = ?1 ORDER BY created_at, id"
        ))
        .map_err(db)?;
    let rows = st.query_map([run_id], wait_row).map_err(db)?;
    rows.collect::<Result<_, _>>().map_err(db)
}

fn armed_wait(c: &Connection, run_id: &str) -> StoreResult<Option<WaitRecord>> {
    c.prepare_cached(&format!(
        "SELECT {WAIT_COLS} FROM waits WHERE run_id = ?1 AND state = 'armed'"
    ))
    .map_err(db)?
    .query_row([run_id], wait_row)
    .optional()
    .map_err(db)
}

/// Arms a wait on a run (replacing, i.e. cancelling, an armed one), with its absolute deadline, and
/// runs one resolution step at once: a buffered match (oldest first), queued user input or an
/// already-past deadline resolves it immediately. Errors: `NotFound`; `Rejected(target_terminal)`.
pub(crate) fn create_wait(
    c: &Connection,
    run_id: &str,
    wait_id: &str,
    spec: &WaitSpec,
    now: i64,
) -> StoreResult<WaitRecord> {
    live_run(c, run_id)?;
    if let Some(old) = armed_wait(c, run_id)? {
        settle_wait(c, &old, WaitState::Cancelled, None, &json!([]), now)?;
        append_event(
            c,
            run_id,
            "tb.wait.cancelled",
            &json!({"waitId": old.id, "reason": "replaced"}),
            now,
        )?;
    }
    let deadline = spec.timeout_ms.map(|t| now + t as i64);
    c.prepare_cached(
        "INSERT INTO waits (id, run_id, spec, deadline, state, created_at) VALUES (?1, ?2, ?3, ?4, 'armed', ?5)",
    )
    .map_err(db)?
    .execute(params![
        wait_id,
        run_id,
        serde_json::to_string(spec).expect("serializable"),
        deadline,
        now
    ])
    .map_err(db)?;
    set_status(
        c,
        run_id,
        RunStatus::WaitingExternal,
        Some(&spec.reason),
        now,
    )?;
    append_event(
        c,
        run_id,
        "tb.wait.started",
        &json!({"waitId": wait_id, "kind": spec.kind, "names": spec.names, "deadline": deadline.map(iso)}),
        now,
    )?;
    resolve_step(c, run_id, now, false)?;
    get_wait(c, run_id, wait_id)
}

/// Cancels an armed wait (the driver's `{action: "cancel"}`). Errors: `NotFound`; `Conflict` when the
/// wait is no longer armed.
pub(crate) fn cancel_wait(
    c: &Connection,
    run_id: &str,
    wait_id: &str,
    now: i64,
) -> StoreResult<WaitRecord> {
    let w = get_wait(c, run_id, wait_id)?;
    if w.state != WaitState::Armed {
        return Err(StoreError::Conflict(format!(
            "the wait is already {}",
            w.state.as_str()
        )));
    }
    settle_wait(c, &w, WaitState::Cancelled, None, &json!([]), now)?;
    append_event(
        c,
        run_id,
        "tb.wait.cancelled",
        &json!({"waitId": wait_id, "reason": "cancelled"}),
        now,
    )?;
    set_status(c, run_id, RunStatus::Running, None, now)?;
    get_wait(c, run_id, wait_id)
}

fn settle_wait(
    c: &Connection,
    w: &WaitRecord,
    state: WaitState,
    winner: Option<&Value>,
    losers: &Value,
    now: i64,
) -> StoreResult<()> {
    c.prepare_cached(
        "UPDATE waits SET state = ?2, winner = ?3, losers = ?4, settled_at = ?5, interrupted_by = NULL WHERE id = ?1",
    )
    .map_err(db)?
    .execute(params![
        w.id,
        state.as_str(),
        winner.map(|v| v.to_string()),
        losers.to_string(),
        now
    ])
    .map_err(db)?;
    Ok(())
}

/// One resolution step for the run's armed wait, if any: gathers the visible candidates (stop; unseen
/// queued user input; the oldest buffered matching signal; a passed deadline), asks
/// [`tb_core::wait::resolve`], and applies the outcome with the losers' dispositions. Returns the wait
/// it resolved or interrupted.
pub(crate) fn resolve_step(
    c: &Connection,
    run_id: &str,
    now: i64,
    stop: bool,
) -> StoreResult<Option<String>> {
    let Some(w) = armed_wait(c, run_id)? else {
        return Ok(None);
    };
    let input: Option<String> = c
        .prepare_cached("SELECT id FROM turns WHERE run_id = ?1 AND user_input = 1 AND state != 'acked' AND seen_by IS NULL ORDER BY seq LIMIT 1")
        .map_err(db)?
        .query_row([run_id], |r| r.get(0))
        .optional()
        .map_err(db)?;
    let signal = oldest_match(c, run_id, &w.spec)?;
    let cand = Candidates {
        stop,
        user_input: input.is_some(),
        signal: signal.is_some(),
        timer: w.deadline.is_some_and(|d| d <= now),
    };
    let res = wait::resolve(
        w.spec.kind,
        w.spec.user_input,
        w.interrupted_by.is_some(),
        cand,
    );
    match res {
        Resolution::Stay => Ok(None),
        Resolution::Interrupt => {
            let turn = input.expect("interrupt implies input");
            mark_seen(c, &turn, &w.id)?;
            c.prepare_cached("UPDATE waits SET interrupted_by = ?2 WHERE id = ?1")
                .map_err(db)?
                .execute(params![w.id, turn])
                .map_err(db)?;
            set_status(c, run_id, RunStatus::Running, None, now)?;
            append_event(
                c,
                run_id,
                "tb.wait.interrupted",
                &json!({"waitId": w.id, "turnId": turn}),
                now,
            )?;
            Ok(Some(w.id))
        }
        Resolution::Resolve { winner, losers } => {
            let mut win = json!({"kind": winner});
            match winner {
                WinnerKind::Signal => {
                    let (seq, env, delivery) = signal.expect("signal winner");
                    c.prepare_cached("UPDATE signals SET state = 'consumed', consumed_by = ?3, settled_at = ?4 WHERE run_id = ?1 AND seq = ?2")
                        .map_err(db)?
                        .execute(params![run_id, seq, w.id, now])
                        .map_err(db)?;
                    append_event(
                        c,
                        run_id,
                        "tb.signal.consumed",
                        &json!({"signalId": env.get("signalId"), "name": env.get("name"), "seq": seq, "waitId": w.id}),
                        now,
                    )?;
                    consume_delivery(c, delivery.as_deref(), now)?;
                    win["signal"] = env;
                }
                WinnerKind::UserInput => {
                    let turn = input.expect("input winner");
                    mark_seen(c, &turn, &w.id)?;
                    win["turnId"] = json!(turn);
                }
                WinnerKind::Timer => {
                    win["deadline"] = json!(w.deadline.map(iso));
                }
                WinnerKind::Stop => {}
            }
            let losers = Value::Array(
                losers
                    .iter()
                    .map(|(k, d)| json!({"kind": k, "disposition": d}))
                    .collect(),
            );
            settle_wait(c, &w, WaitState::Resolved, Some(&win), &losers, now)?;
            let ty = if winner == WinnerKind::Timer {
                "tb.wait.timeout"
            } else {
                "tb.wait.resolved"
            };
            append_event(
                c,
                run_id,
                ty,
                &json!({"waitId": w.id, "winner": winner, "losers": losers}),
                now,
            )?;
            if winner != WinnerKind::Stop {
                set_status(c, run_id, RunStatus::Running, None, now)?;
                let view = wait_view(&get_wait(c, run_id, &w.id)?);
                insert_turn(
                    c,
                    run_id,
                    TurnKind::Wait,
                    &turn::wait_content(&view),
                    None,
                    false,
                    now,
                )?;
            }
            Ok(Some(w.id))
        }
    }
}

fn mark_seen(c: &Connection, turn: &str, wait: &str) -> StoreResult<()> {
    c.prepare_cached("UPDATE turns SET seen_by = ?2 WHERE id = ?1")
        .map_err(db)?
        .execute(params![turn, wait])
        .map_err(db)?;
    Ok(())
}

/// The oldest buffered signal whose name the wait takes: (seq, envelope, delivery id).
fn oldest_match(
    c: &Connection,
    run_id: &str,
    spec: &WaitSpec,
) -> StoreResult<Option<(i64, Value, Option<String>)>> {
    let mut st = c
        .prepare_cached("SELECT seq, name, envelope, delivery_id FROM signals WHERE run_id = ?1 AND state = 'buffered' ORDER BY seq")
        .map_err(db)?;
    let mut rows = st.query([run_id]).map_err(db)?;
    while let Some(r) = rows.next().map_err(db)? {
        let name: String = r.get(1).map_err(db)?;
        if spec.takes(&name) {
            return Ok(Some((
                r.get(0).map_err(db)?,
                json_col(r.get(2).map_err(db)?).unwrap_or(Value::Null),
                r.get(3).map_err(db)?,
            )));
        }
    }
    Ok(None)
}

/// The API view of a wait: `{waitId, runId, kind, names, state, reason, deadline?, interrupted,
/// winner?, losers}`.
pub fn wait_view(w: &WaitRecord) -> Value {
    let mut v = json!({
        "waitId": w.id,
        "runId": w.run_id,
        "kind": w.spec.kind,
        "names": w.spec.names,
        "state": w.state,
        "reason": w.spec.reason,
        "interrupted": w.interrupted_by.is_some(),
        "losers": w.losers,
        "createdAt": iso(w.created_at),
    });
    if w.spec.kind == WaitKind::Any {
        v["userInput"] = json!(w.spec.user_input);
    }
    if let Some(d) = w.deadline {
        v["deadline"] = json!(iso(d));
    }
    if let Some(win) = &w.winner {
        v["winner"] = win.clone();
    }
    if let Some(s) = w.settled_at {
        v["settledAt"] = json!(iso(s));
    }
    v
}

/// Resolves armed waits whose deadline has passed (at most `limit`); returns how many resolved.
pub(crate) fn fire_timers(c: &Connection, now: i64, limit: u32) -> StoreResult<u32> {
    let runs: Vec<String> = c
        .prepare_cached("SELECT run_id FROM waits INDEXED BY waits_due WHERE state = 'armed' AND deadline IS NOT NULL AND deadline <= ?1 AND interrupted_by IS NULL ORDER BY deadline LIMIT ?2")
        .map_err(db)?
        .query_map(params![now, limit], |r| r.get(0))
        .map_err(db)?
        .collect::<Result<_, _>>()
        .map_err(db)?;
    let mut n = 0;
    for r in runs {
        if resolve_step(c, &r, now, false)?.is_some() {
            n += 1;
        }
    }
    Ok(n)
}

pub(crate) fn next_timer_at(c: &Connection) -> StoreResult<Option<i64>> {
    c.prepare_cached("SELECT MIN(deadline) FROM waits WHERE state = 'armed' AND deadline IS NOT NULL AND interrupted_by IS NULL")
        .map_err(db)?
        .query_row([], |r| r.get(0))
        .map_err(db)
}

/// On a run's end: its armed wait resolves with winner `stop`, and receipts whose signals were still
/// buffered end `expired`.
pub(crate) fn on_run_end(c: &Connection, run_id: &str, now: i64) -> StoreResult<()> {
    resolve_step(c, run_id, now, true)?;
    c.prepare_cached(
        "UPDATE receipts SET state = 'expired', updated_at = ?2 WHERE state = 'queued' AND id IN \
         (SELECT d.receipt_id FROM signals s JOIN deliveries d ON d.id = s.delivery_id WHERE s.run_id = ?1 AND s.state = 'buffered')",
    )
    .map_err(db)?
    .execute(params![run_id, now])
    .map_err(db)?;
    Ok(())
}

// --- webhook effects ----------------------------------------------------------------------------

/// Resolves a target to a run id. Errors: `Rejected(not_found)` "target_missing" when no live session
/// holds the key.
fn target_run(c: &Connection, t: &Target) -> StoreResult<String> {
    match t {
        Target::Run(r) => Ok(r.clone()),
        Target::Session { workflow_id, key } => c
            .prepare_cached("SELECT run_id FROM coalesce_keys WHERE workflow_id = ?1 AND key = ?2")
            .map_err(db)?
            .query_row(params![workflow_id, key], |r| r.get(0))
            .optional()
            .map_err(db)?
            .ok_or_else(|| rejected(ErrorCode::NotFound, "no session holds this coalesce key")),
    }
}

/// What an effect did: the run it started or targeted, whether a new run is to be written, and whether
/// its effect is consumed already.
pub(crate) struct EffectDone {
    pub run_id: String,
    pub start: bool,
    pub consumed: bool,
}

/// Performs a delivery's local effect (see [`Effect`]).
pub(crate) fn apply_effect(c: &Connection, e: &Effect, now: i64) -> StoreResult<EffectDone> {
    match e {
        Effect::StartSession { run, coalesce } => {
            if let Some(co) = coalesce {
                let held: Option<String> = c
                    .prepare_cached(
                        "SELECT run_id FROM coalesce_keys WHERE workflow_id = ?1 AND key = ?2",
                    )
                    .map_err(db)?
                    .query_row(params![co.workflow_id, co.key], |r| r.get(0))
                    .optional()
                    .map_err(db)?;
                let live = match &held {
                    Some(r) => !read::get_run(c, r)?.status.is_terminal(),
                    None => false,
                };
                if let (true, Some(existing)) = (live, held) {
                    let consumed = match co.on_existing {
                        tb_core::binding::OnExisting::Noop => true,
                        tb_core::binding::OnExisting::Signal => {
                            let s = co.signal.as_ref().ok_or_else(|| {
                                rejected(
                                    ErrorCode::ValidationError,
                                    "on_existing = signal needs a signal name",
                                )
                            })?;
                            raise_signal(c, &existing, s, now)?;
                            false
                        }
                        tb_core::binding::OnExisting::Prompt => {
                            let p = co.prompt.as_ref().ok_or_else(|| {
                                rejected(
                                    ErrorCode::ValidationError,
                                    "on_existing = prompt needs a prompt",
                                )
                            })?;
                            enqueue_prompt(c, &existing, p, now)?;
                            false
                        }
                    };
                    return Ok(EffectDone {
                        run_id: existing,
                        start: false,
                        consumed,
                    });
                }
                // First event for the key, or the session holding it has ended: this run takes it.
                c.prepare_cached(
                    "INSERT INTO coalesce_keys (workflow_id, key, run_id, created_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (workflow_id, key) DO UPDATE SET run_id = excluded.run_id, created_at = excluded.created_at",
                )
                .map_err(db)?
                .execute(params![co.workflow_id, co.key, run.id, now])
                .map_err(db)?;
            }
            Ok(EffectDone {
                run_id: run.id.clone(),
                start: true,
                consumed: true,
            })
        }
        Effect::RaiseSignal { target, signal } => {
            let run_id = target_run(c, target)?;
            let out = raise_signal(c, &run_id, signal, now)?;
            Ok(EffectDone {
                run_id,
                start: false,
                // A duplicate raise was consumed (or is buffered) under its first delivery.
                consumed: out.status == "duplicate",
            })
        }
        Effect::EnqueuePrompt { target, prompt } => {
            let run_id = target_run(c, target)?;
            enqueue_prompt(c, &run_id, prompt, now)?;
            Ok(EffectDone {
                run_id,
                start: false,
                consumed: false,
            })
        }
    }
}

/// Writes a new session run's start turn and its mailbox policy (after the run row exists).
pub(crate) fn start_session(
    c: &Connection,
    run_id: &str,
    content: &Value,
    mailbox: &MailboxPolicy,
    now: i64,
) -> StoreResult<()> {
    c.prepare_cached("UPDATE runs SET mailbox = ?2 WHERE id = ?1")
        .map_err(db)?
        .execute(params![
            run_id,
            serde_json::to_string(mailbox).expect("json")
        ])
        .map_err(db)?;
    insert_turn(c, run_id, TurnKind::Start, content, None, false, now)?;
    Ok(())
}

// --- capability endpoints -----------------------------------------------------------------------

const CAP_COLS: &str = "id, run_id, signal, label, wake, hmac_file, created_by, created_at, expires_at, max_uses, use_count, revoked_at";

fn cap_row(r: &Row) -> rusqlite::Result<CapabilityRecord> {
    let hmac_file: Option<String> = r.get(5)?;
    Ok(CapabilityRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        signal: r.get(2)?,
        label: r.get(3)?,
        wake: r.get(4)?,
        hmac: hmac_file.is_some(),
        hmac_file,
        created_by: r.get(6)?,
        created_at: r.get(7)?,
        expires_at: r.get(8)?,
        max_uses: r.get(9)?,
        use_count: r.get(10)?,
        revoked_at: r.get(11)?,
    })
}

/// Stores a minted endpoint (its token only as `token_hash`). Errors: `NotFound` for an unknown run;
/// `Rejected(target_terminal)` for an ended one.
pub(crate) fn create_capability(
    c: &Connection,
    cap: &CapabilityRecord,
    token_hash: &str,
) -> StoreResult<()> {
    live_run(c, &cap.run_id)?;
    c.prepare_cached(&format!(
        "INSERT INTO capabilities ({CAP_COLS}, token_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0, NULL, ?11)"
    ))
    .map_err(db)?
    .execute(params![
        cap.id,
        cap.run_id,
        cap.signal,
        cap.label,
        cap.wake,
        cap.hmac_file,
        cap.created_by,
        cap.created_at,
        cap.expires_at,
        cap.max_uses,
        token_hash
    ])
    .map_err(db)?;
    Ok(())
}

pub(crate) fn list_capabilities(c: &Connection) -> StoreResult<Vec<CapabilityRecord>> {
    let mut st = c
        .prepare_cached(&format!(
            "SELECT {CAP_COLS} FROM capabilities ORDER BY created_at DESC, id DESC"
        ))
        .map_err(db)?;
    let rows = st.query_map([], cap_row).map_err(db)?;
    rows.collect::<Result<_, _>>().map_err(db)
}

/// A usable endpoint by token hash: not revoked, not expired, uses left. `None` for all four failures
/// alike (signals-and-connectors §4.2: the same 404).
pub(crate) fn capability_by_hash(
    c: &Connection,
    token_hash: &str,
    now: i64,
) -> StoreResult<Option<CapabilityRecord>> {
    c.prepare_cached(&format!(
        "SELECT {CAP_COLS} FROM capabilities WHERE token_hash = ?1 AND revoked_at IS NULL AND expires_at > ?2 AND use_count < max_uses"
    ))
    .map_err(db)?
    .query_row(params![token_hash, now], cap_row)
    .optional()
    .map_err(db)
}

/// Counts one use inside the receipt's transaction. Errors: `Rejected(not_found)` when the endpoint was
/// revoked, expired or used up meanwhile (nothing is committed).
pub(crate) fn use_capability(c: &Connection, id: &str, now: i64) -> StoreResult<()> {
    let n = c
        .prepare_cached("UPDATE capabilities SET use_count = use_count + 1 WHERE id = ?1 AND revoked_at IS NULL AND expires_at > ?2 AND use_count < max_uses")
        .map_err(db)?
        .execute(params![id, now])
        .map_err(db)?;
    if n == 0 {
        return Err(rejected(ErrorCode::NotFound, "no such endpoint"));
    }
    Ok(())
}

/// Revokes an endpoint at once. Errors: `NotFound`; `Conflict` when already revoked.
pub(crate) fn revoke_capability(
    c: &Connection,
    id: &str,
    now: i64,
) -> StoreResult<CapabilityRecord> {
    let n = c
        .prepare_cached(
            "UPDATE capabilities SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        )
        .map_err(db)?
        .execute(params![id, now])
        .map_err(db)?;
    let rec = c
        .prepare_cached(&format!(
            "SELECT {CAP_COLS} FROM capabilities WHERE id = ?1"
        ))
        .map_err(db)?
        .query_row([id], cap_row)
        .optional()
        .map_err(db)?
        .ok_or_else(|| StoreError::NotFound("capability endpoint".into()))?;
    if n == 0 {
        return Err(StoreError::Conflict(
            "the endpoint is already revoked".into(),
        ));
    }
    Ok(rec)
}
