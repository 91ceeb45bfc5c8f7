//! Turns on SQLite: the per-run queue a session's driver claims one at a time (leased, acknowledged).

use super::*;
use crate::p;
use crate::sql::{Db, Row};

pub(super) fn insert_turn(
    c: &dyn Db,
    run_id: &str,
    kind: TurnKind,
    content: &Value,
    delivery_id: Option<&str>,
    user_input: bool,
    now: i64,
) -> StoreResult<String> {
    let id = new_id(IdKind::Turn);
    c.exec(
        "INSERT INTO turns (id, run_id, seq, kind, content, state, delivery_id, user_input, created_at) \
         VALUES (?1, ?2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM turns WHERE run_id = ?2), ?3, ?4, 'queued', ?5, ?6, ?7)", p![id, run_id, kind.as_str(), content.to_string(), delivery_id, user_input, now])?;
    append_event(
        c,
        run_id,
        "tb.turn.queued",
        &json!({"turnId": id, "kind": kind.as_str()}),
        now,
    )?;
    Ok(id)
}

pub(super) const TURN_COLS: &str =
    "id, run_id, seq, kind, content, state, lease_until, claims, created_at, acked_at";

pub(super) fn turn_row(r: &Row) -> StoreResult<TurnRecord> {
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
    c: &dyn Db,
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

pub(crate) fn get_turn(c: &dyn Db, run_id: &str, id: &str) -> StoreResult<TurnRecord> {
    one_of_run(
        c,
        &format!("SELECT {TURN_COLS} FROM turns WHERE id = ?1 AND run_id = ?2"),
        run_id,
        id,
        turn_row,
        "turn",
    )
}

pub(crate) fn list_turns(c: &dyn Db, run_id: &str) -> StoreResult<Vec<TurnRecord>> {
    all_of_run(
        c,
        &format!("SELECT {TURN_COLS} FROM turns WHERE run_id = ?1 ORDER BY seq"),
        run_id,
        turn_row,
    )
}

/// One row of a run's table by `(id, run_id)`, or `NotFound(what)`.
pub(super) fn one_of_run<T>(
    c: &dyn Db,
    sql: &str,
    run_id: &str,
    id: &str,
    map: fn(&Row) -> StoreResult<T>,
    what: &str,
) -> StoreResult<T> {
    c.row(sql, p![id, run_id], map)?
        .ok_or_else(|| StoreError::NotFound(what.into()))
}

/// Every row of a run's table (`?1` = run id); `NotFound("run")` for an unknown run.
pub(super) fn all_of_run<T>(
    c: &dyn Db,
    sql: &str,
    run_id: &str,
    map: fn(&Row) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    read::get_run(c, run_id)?;
    c.rows(sql, p![run_id], map)
}

/// Claims the run's next turn in order: one turn at a time, so a turn still leased (lease not lapsed)
/// blocks the next. A lapsed lease is redelivered (`claims` grows). `None` when nothing is claimable.
pub(crate) fn claim_turn(
    c: &dyn Db,
    run_id: &str,
    lease_ms: u64,
    now: i64,
) -> StoreResult<Option<TurnRecord>> {
    live_run(c, run_id)?;
    let next: Option<(String, String, Option<i64>)> = c
        .row(
            "SELECT id, state, lease_until FROM turns WHERE run_id = ?1 AND state IN ('queued', 'leased') ORDER BY seq LIMIT 1", p![run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    let Some((id, state, lease_until)) = next else {
        return Ok(None);
    };
    if state == "leased" && lease_until.is_some_and(|l| l > now) {
        return Ok(None);
    }
    c.exec(
        "UPDATE turns SET state = 'leased', lease_until = ?2, claims = claims + 1 WHERE id = ?1",
        p![id, now + lease_ms as i64],
    )?;
    get_turn(c, run_id, &id).map(Some)
}

/// Acknowledges a claimed turn: its prompt or wake delivery counts as consumed, and a wait it
/// interrupted re-arms with its original absolute deadline (then resolves at once if it can).
/// Errors: `NotFound`; `Conflict` when the turn is not leased (never claimed, or already acked).
pub(crate) fn ack_turn(
    c: &dyn Db,
    run_id: &str,
    turn_id: &str,
    claim: u32,
    now: i64,
) -> StoreResult<TurnRecord> {
    live_run(c, run_id)?;
    let t = get_turn(c, run_id, turn_id)?;
    if t.state == TurnState::Leased && t.claims != claim {
        let why = if claim < t.claims && claim > 0 {
            "it was claimed again after this claim's lease lapsed"
        } else {
            "pass the claims count the claim returned"
        };
        return Err(StoreError::Conflict(format!(
            "claim {claim} does not match this turn's current claim {}: {why}",
            t.claims
        )));
    }
    if t.state != TurnState::Leased {
        return Err(StoreError::Conflict(format!(
            "only a claimed turn can be acknowledged; this one is {}",
            t.state.as_str()
        )));
    }
    let delivery: Option<String> = c
        .row("UPDATE turns SET state = 'acked', acked_at = ?2, lease_until = NULL WHERE id = ?1 RETURNING delivery_id", p![turn_id, now], |r| r.get(0))?.ok_or_else(no_row)?;
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
        .row("UPDATE waits SET interrupted_by = NULL WHERE run_id = ?1 AND state = 'armed' AND interrupted_by = ?2 RETURNING id, spec", p![run_id, turn_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
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
