//! Turns: the per-run queue a session's driver claims one at a time (leased, acknowledged), and a new
//! session's start turn; rules in `tb_core::turn` and `tb_core::session::start`.

use super::*;
use crate::p;
use crate::sql::{Db, Row};
use tb_core::session::Writes;
use tb_core::signal::MailboxPolicy;
use tb_core::turn::{self, Claim, IncomingPrompt};

/// The columns [`turn_row`] reads, from `turns t` joined to what renders a start turn: its run's
/// workflow id and inputs and its session configuration (`session_configs`, by `t.config_ref`; both
/// joins match nothing for other turns). Use as `SELECT {TURN_COLS} FROM {TURN_FROM} WHERE ...`.
pub(super) const TURN_COLS: &str =
    "t.id, t.run_id, t.seq, t.kind, t.content, t.state, t.lease_until, t.claims, t.created_at, t.acked_at, \
     r.workflow_id, r.inputs, sc.config";

/// The tables [`TURN_COLS`] reads.
pub(super) const TURN_FROM: &str = "turns t \
     LEFT JOIN session_configs sc ON t.config_ref IS NOT NULL AND sc.hash = t.config_ref \
     LEFT JOIN runs r ON t.config_ref IS NOT NULL AND r.id = t.run_id";

/// A turn as its reader sees it. A start turn stored by reference is rendered here with
/// `tb_core::turn::start_content(run's workflow id, configuration, run's inputs)`, the very content
/// that was stored in full before; other turns (and start turns written before) are their stored JSON.
pub(super) fn turn_row(r: &Row) -> StoreResult<TurnRecord> {
    let kind: String = r.get(3)?;
    let state: String = r.get(5)?;
    let config: Option<String> = r.get(12)?;
    let content = match config {
        Some(config) => {
            let workflow: String = r.get(10)?;
            let inputs = json_col(r.get(11)?).unwrap_or(Value::Null);
            turn::start_content(&workflow, &read::json(config), &inputs)
        }
        None => json_col(r.get(4)?).unwrap_or(Value::Null),
    };
    Ok(TurnRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        seq: r.get(2)?,
        kind: TurnKind::parse(&kind).unwrap_or(TurnKind::Prompt),
        content,
        state: TurnState::parse(&state).unwrap_or(TurnState::Queued),
        lease_until: r.get(6)?,
        claims: r.get(7)?,
        created_at: r.get(8)?,
        acked_at: r.get(9)?,
    })
}

/// Enqueues a prompt as accepted user input (rule: `tb_core::turn::enqueue`), which then interrupts or
/// wins the run's armed wait. Returns the new turn. Errors: `NotFound("run")`;
/// `Rejected(target_terminal)`.
pub(crate) fn enqueue_prompt(
    c: &dyn Db,
    run_id: &str,
    p: &NewPrompt,
    now: i64,
) -> StoreResult<TurnRecord> {
    let snap = snapshot::load(c, run_id, None)?;
    let incoming = IncomingPrompt {
        text: &p.text,
        variables: &p.variables,
        from: &p.from,
        delivery_id: p.delivery_id.as_deref(),
    };
    let (id, w, _) = with_ctx(now, |ctx| turn::enqueue(&snap, &incoming, ctx)).map_err(refused)?;
    apply::apply(c, run_id, snap.counters, &w, None, now)?;
    get_turn(c, run_id, &id)
}

pub(crate) fn get_turn(c: &dyn Db, run_id: &str, id: &str) -> StoreResult<TurnRecord> {
    one_of_run(
        c,
        &format!("SELECT {TURN_COLS} FROM {TURN_FROM} WHERE t.id = ?1 AND t.run_id = ?2"),
        run_id,
        id,
        turn_row,
        RecordKind::Turn,
    )
}

pub(crate) fn list_turns(c: &dyn Db, run_id: &str) -> StoreResult<Vec<TurnRecord>> {
    all_of_run(
        c,
        &format!("SELECT {TURN_COLS} FROM {TURN_FROM} WHERE t.run_id = ?1 ORDER BY t.seq"),
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
    what: RecordKind,
) -> StoreResult<T> {
    c.row(sql, p![id, run_id], map)?
        .ok_or_else(|| StoreError::not_found(what))
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

/// Claims the run's next turn in order (rule: `tb_core::turn::claim`): one turn at a time, so a turn
/// still leased blocks the next; a lapsed lease is redelivered (`claims` grows). The lease is fenced by
/// the claim count it was read with. `None` when nothing is claimable. Errors: `NotFound("run")`;
/// `Rejected(target_terminal)`.
pub(crate) fn claim_turn(
    c: &dyn Db,
    run_id: &str,
    lease_ms: u64,
    now: i64,
) -> StoreResult<Option<TurnRecord>> {
    let head = snapshot::lock_head(c, run_id)?;
    let next = snapshot::head_turn(c, run_id)?;
    match turn::claim(head.status, next.as_ref(), lease_ms, now).map_err(refused)? {
        Claim::Empty | Claim::Held { .. } => Ok(None),
        Claim::Lease { turn_id, op, .. } => {
            let w = Writes {
                ops: vec![op],
                counters: head.counters,
            };
            apply::apply(c, run_id, head.counters, &w, None, now)?;
            get_turn(c, run_id, &turn_id).map(Some)
        }
    }
}

/// Acknowledges a claimed turn with the claim count its claim returned (rule: `tb_core::turn::ack`): its
/// prompt or wake delivery counts as consumed, and a wait it interrupted re-arms with its original
/// absolute deadline (then resolves at once if it can). Errors: `NotFound("run" | "turn")`;
/// `Rejected(target_terminal)`; `Conflict` when the turn is not leased under this claim.
pub(crate) fn ack_turn(
    c: &dyn Db,
    run_id: &str,
    turn_id: &str,
    claim: u32,
    now: i64,
) -> StoreResult<TurnRecord> {
    let snap = snapshot::load(c, run_id, Some(turn_id))?;
    let t = snapshot::acked_turn(c, run_id, turn_id)?;
    let (w, _) = with_ctx(now, |ctx| turn::ack(&snap, &t, claim, ctx)).map_err(refused)?;
    apply::apply(c, run_id, snap.counters, &w, None, now)?;
    get_turn(c, run_id, turn_id)
}

/// Writes a new session run's mailbox policy (only when it is not the default: `NULL` reads as
/// `MailboxPolicy::default()`) and its start turn (rule: `tb_core::session::start`), after the run row
/// and its first events exist (`write::insert_run`), at the counters they left. `config` is the
/// workflow's session configuration: kept once per distinct value in `session_configs` under
/// `tb_core::turn::config_ref` (`ON CONFLICT DO NOTHING`: equal texts, equal key), and referenced by
/// the start turn instead of copied into it.
pub(crate) fn start_session(
    c: &dyn Db,
    run_id: &str,
    config: &Value,
    mailbox: &MailboxPolicy,
    now: i64,
) -> StoreResult<()> {
    if *mailbox != MailboxPolicy::default() {
        c.exec(
            "UPDATE runs SET mailbox = ?2 WHERE id = ?1",
            p![run_id, serde_json::to_string(mailbox).expect("json")],
        )?;
    }
    let config_ref = turn::config_ref(config);
    c.exec(
        "INSERT INTO session_configs (hash, config, created_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (hash) DO NOTHING",
        p![config_ref, config.to_string(), now],
    )?;
    let head = snapshot::lock_head(c, run_id)?;
    let w = with_ctx(now, |ctx| {
        tb_core::session::start(head.counters, config_ref, ctx)
    });
    apply::apply(c, run_id, head.counters, &w, None, now)?;
    Ok(())
}
