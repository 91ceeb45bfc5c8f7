//! Waits on SQLite: arming, cancelling, and the one resolution step (rule: `tb_core::wait::resolve`).

use super::*;
use crate::p;
use crate::sql::{Db, Row};

pub(super) const WAIT_COLS: &str =
    "id, run_id, spec, deadline, state, interrupted_by, winner, losers, created_at, settled_at";

pub(super) fn wait_row(r: &Row) -> StoreResult<WaitRecord> {
    let spec: String = r.get(2)?;
    let state: String = r.get(4)?;
    Ok(WaitRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        spec: serde_json::from_str(&spec)
            .map_err(|e| StoreError::Database(format!("bad wait spec in the store: {e}")))?,
        deadline: r.get(3)?,
        state: WaitState::parse(&state).unwrap_or(WaitState::Armed),
        interrupted_by: r.get(5)?,
        winner: json_col(r.get(6)?),
        losers: json_col(r.get(7)?).unwrap_or_else(|| json!([])),
        created_at: r.get(8)?,
        settled_at: r.get(9)?,
    })
}

pub(crate) fn get_wait(c: &dyn Db, run_id: &str, id: &str) -> StoreResult<WaitRecord> {
    one_of_run(
        c,
        &format!("SELECT {WAIT_COLS} FROM waits WHERE id = ?1 AND run_id = ?2"),
        run_id,
        id,
        wait_row,
        "wait",
    )
}

pub(crate) fn list_waits(c: &dyn Db, run_id: &str) -> StoreResult<Vec<WaitRecord>> {
    all_of_run(
        c,
        &format!("SELECT {WAIT_COLS} FROM waits WHERE run_id = ?1 ORDER BY created_at, id"),
        run_id,
        wait_row,
    )
}

pub(super) fn armed_wait(c: &dyn Db, run_id: &str) -> StoreResult<Option<WaitRecord>> {
    c.row(
        &format!("SELECT {WAIT_COLS} FROM waits WHERE run_id = ?1 AND state = 'armed'"),
        p![run_id],
        wait_row,
    )
}

/// Arms a wait on a run (replacing, i.e. cancelling, an armed one), with its absolute deadline, and
/// runs one resolution step at once: a buffered match (oldest first), queued user input or an
/// already-past deadline resolves it immediately. Errors: `NotFound`; `Rejected(target_terminal)`.
pub(crate) fn create_wait(
    c: &dyn Db,
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
    c.exec(
        "INSERT INTO waits (id, run_id, spec, deadline, state, created_at) VALUES (?1, ?2, ?3, ?4, 'armed', ?5)", p![
        wait_id,
        run_id,
        serde_json::to_string(spec).expect("serializable"),
        deadline,
        now
    ])?;
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
        &json!({"waitId": wait_id, "kind": spec.kind, "names": spec.names, "deadline": deadline.map(rfc3339)}),
        now,
    )?;
    resolve_step(c, run_id, now, false)?;
    get_wait(c, run_id, wait_id)
}

/// Cancels an armed wait (the driver's `{action: "cancel"}`). Errors: `NotFound`; `Conflict` when the
/// wait is no longer armed.
pub(crate) fn cancel_wait(
    c: &dyn Db,
    run_id: &str,
    wait_id: &str,
    now: i64,
) -> StoreResult<WaitRecord> {
    read::lock_run(c, run_id)?;
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

pub(super) fn settle_wait(
    c: &dyn Db,
    w: &WaitRecord,
    state: WaitState,
    winner: Option<&Value>,
    losers: &Value,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "UPDATE waits SET state = ?2, winner = ?3, losers = ?4, settled_at = ?5, interrupted_by = NULL WHERE id = ?1", p![
        w.id,
        state.as_str(),
        winner.map(|v| v.to_string()),
        losers.to_string(),
        now
    ])?;
    Ok(())
}

/// One resolution step for the run's armed wait, if any: gathers the visible candidates (stop; unseen
/// queued user input; the oldest buffered matching signal; a passed deadline), asks
/// [`tb_core::wait::resolve`], and applies the outcome with the losers' dispositions. Returns the wait
/// it resolved or interrupted.
pub(crate) fn resolve_step(
    c: &dyn Db,
    run_id: &str,
    now: i64,
    stop: bool,
) -> StoreResult<Option<String>> {
    // Callers inside a run operation hold the lock already; the timer loop comes here first.
    read::lock_run(c, run_id)?;
    let Some(w) = armed_wait(c, run_id)? else {
        return Ok(None);
    };
    let input: Option<String> = c
        .row("SELECT id FROM turns WHERE run_id = ?1 AND user_input = 1 AND state != 'acked' AND seen_by IS NULL ORDER BY seq LIMIT 1", p![run_id], |r| r.get(0))?;
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
            c.exec(
                "UPDATE waits SET interrupted_by = ?2 WHERE id = ?1",
                p![w.id, turn],
            )?;
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
            // Bounded labels only (DESIGN §11): the winner kind, never ids.
            let kind = match winner {
                WinnerKind::Stop => "stop",
                WinnerKind::UserInput => "user_input",
                WinnerKind::Signal => "signal",
                WinnerKind::Timer => "timer",
            };
            metrics::counter!("tb_wait_resolutions_total", "winner" => kind).increment(1);
            metrics::histogram!("tb_wait_duration_seconds", "winner" => kind)
                .record((now - w.created_at).max(0) as f64 / 1000.0);
            let mut win = json!({"kind": winner});
            match winner {
                WinnerKind::Signal => {
                    let (seq, env, delivery) = signal.expect("signal winner");
                    c.exec("UPDATE signals SET state = 'consumed', consumed_by = ?3, settled_at = ?4 WHERE run_id = ?1 AND seq = ?2", p![run_id, seq, w.id, now])?;
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
                    win["deadline"] = json!(w.deadline.map(rfc3339));
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

pub(super) fn mark_seen(c: &dyn Db, turn: &str, wait: &str) -> StoreResult<()> {
    c.exec(
        "UPDATE turns SET seen_by = ?2 WHERE id = ?1",
        p![turn, wait],
    )?;
    Ok(())
}

/// The oldest buffered signal whose name the wait takes: (seq, envelope, delivery id).
pub(super) fn oldest_match(
    c: &dyn Db,
    run_id: &str,
    spec: &WaitSpec,
) -> StoreResult<Option<(i64, Value, Option<String>)>> {
    let rows = c.query(
        "SELECT seq, name, envelope, delivery_id FROM signals WHERE run_id = ?1 AND state = 'buffered' ORDER BY seq",
        p![run_id],
    )?;
    for r in &rows {
        let name: String = r.get(1)?;
        if spec.takes(&name) {
            return Ok(Some((
                r.get(0)?,
                json_col(r.get(2)?).unwrap_or(Value::Null),
                r.get(3)?,
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
        "createdAt": rfc3339(w.created_at),
    });
    if w.spec.kind == WaitKind::Any {
        v["userInput"] = json!(w.spec.user_input);
    }
    if let Some(d) = w.deadline {
        v["deadline"] = json!(rfc3339(d));
    }
    if let Some(win) = &w.winner {
        v["winner"] = win.clone();
    }
    if let Some(s) = w.settled_at {
        v["settledAt"] = json!(rfc3339(s));
    }
    v
}

/// Resolves armed waits whose deadline has passed (at most `limit`); returns how many resolved.
pub(crate) fn fire_timers(c: &dyn Db, now: i64, limit: u32) -> StoreResult<u32> {
    let runs: Vec<String> = c
        .rows("SELECT run_id FROM waits INDEXED BY waits_due WHERE state = 'armed' AND deadline IS NOT NULL AND deadline <= ?1 AND interrupted_by IS NULL ORDER BY deadline LIMIT ?2", p![now, limit], |r| r.get(0))?;
    let mut n = 0;
    for r in runs {
        if resolve_step(c, &r, now, false)?.is_some() {
            n += 1;
        }
    }
    Ok(n)
}

pub(crate) fn next_timer_at(c: &dyn Db) -> StoreResult<Option<i64>> {
    Ok(c
        .value::<Option<i64>>(
            "SELECT MIN(deadline) FROM waits WHERE state = 'armed' AND deadline IS NOT NULL AND interrupted_by IS NULL",
            p![],
        )?
        .flatten())
}

/// On a run's end: its armed wait resolves with winner `stop`; signals still buffered, turns not yet
/// acknowledged, and their receipts, end `expired`.
pub(crate) fn on_run_end(c: &dyn Db, run_id: &str, now: i64) -> StoreResult<()> {
    resolve_step(c, run_id, now, true)?;
    c.exec(
        "UPDATE receipts SET state = 'expired', updated_at = ?2 WHERE state = 'queued' AND id IN \
         (SELECT d.receipt_id FROM signals s JOIN deliveries d ON d.id = s.delivery_id WHERE s.run_id = ?1 AND s.state = 'buffered')", p![run_id, now])?;
    // Prompts (and wake-ups) never acknowledged can no longer be: their receipts end `expired` too.
    c.exec(
        "UPDATE receipts SET state = 'expired', updated_at = ?2 WHERE state = 'queued' AND id IN \
         (SELECT d.receipt_id FROM turns t JOIN deliveries d ON d.id = t.delivery_id WHERE t.run_id = ?1 AND t.state != 'acked')", p![run_id, now])?;
    // What is still buffered or queued can never be consumed now.
    c.exec(
        "UPDATE signals SET state = 'expired', settled_at = ?2 WHERE run_id = ?1 AND state = 'buffered'", p![run_id, now])?;
    c.exec(
        "UPDATE turns SET state = 'expired', lease_until = NULL WHERE run_id = ?1 AND state != 'acked'", p![run_id])?;
    Ok(())
}
