//! What a session rule reads, loaded under the run's row lock (the queries `tb_core::session::
//! SessionSnapshot` documents). The lock comes first: every writer of a run's signals, turns and waits
//! takes it, so the rows read after it need no lock of their own.

use super::*;
use crate::sql::Row;
use tb_core::run::RunStatus;
use tb_core::session::{ArmedWait, BufferedSignal, Counters, OpenTurn, SessionSnapshot};
use tb_core::signal::{DataPlacement, FirstSignal, MailboxPolicy};
use tb_core::turn::{AckedTurn, HeadTurn};

/// The run row's part of a snapshot: status, counters and mailbox policy.
#[derive(Debug, Clone)]
pub(super) struct RunHead {
    pub status: RunStatus,
    pub counters: Counters,
    pub mailbox: MailboxPolicy,
}

/// Locks the run row (`FOR UPDATE` on PostgreSQL, the same lock as [`read::lock_run`]; SQLite's one
/// writer already serializes) and reads its status, counters (`next_signal_seq`, `next_turn_seq`,
/// `next_sequence`) and mailbox policy (default when NULL). Errors: `NotFound("run")`.
pub(super) fn lock_head(c: &dyn Db, run_id: &str) -> StoreResult<RunHead> {
    c.row(
        &format!(
            "SELECT status, next_signal_seq, next_turn_seq, next_sequence, mailbox FROM runs WHERE id = ?1{}",
            c.dialect().for_update()
        ),
        p![run_id],
        |r| {
            let status: String = r.get(0)?;
            let mailbox: Option<String> = r.get(4)?;
            Ok(RunHead {
                status: RunStatus::parse(&status).ok_or_else(|| read::bad("run status", &status))?,
                counters: Counters {
                    next_signal_seq: r.get(1)?,
                    next_turn_seq: r.get(2)?,
                    next_event_seq: r.get(3)?,
                },
                mailbox: mailbox
                    .and_then(|m| serde_json::from_str(&m).ok())
                    .unwrap_or_default(),
            })
        },
    )?
    .ok_or_else(|| StoreError::not_found(RecordKind::Run))
}

/// Locks the run and loads the whole snapshot: the run head, buffered signals by `seq`, the armed
/// wait, and the oldest unseen user-input turn other than `excluding_turn` (the turn being
/// acknowledged). Errors: `NotFound("run")`.
pub(super) fn load(
    c: &dyn Db,
    run_id: &str,
    excluding_turn: Option<&str>,
) -> StoreResult<SessionSnapshot> {
    let head = lock_head(c, run_id)?;
    let buffered = c.rows(
        "SELECT seq, signal_id, name, delivery_id FROM signals WHERE run_id = ?1 AND state = 'buffered' ORDER BY seq",
        p![run_id],
        |r| {
            Ok(BufferedSignal {
                seq: r.get(0)?,
                signal_id: r.get(1)?,
                name: r.get(2)?,
                delivery_id: r.get(3)?,
            })
        },
    )?;
    let wait = c.row(
        "SELECT id, spec, deadline, interrupted_by, created_at FROM waits WHERE run_id = ?1 AND state = 'armed'",
        p![run_id],
        armed_wait,
    )?;
    let unseen_input = c.value(
        "SELECT id FROM turns WHERE run_id = ?1 AND user_input = 1 AND state NOT IN ('acked', 'expired') \
         AND seen_by IS NULL AND id <> ?2 ORDER BY seq LIMIT 1",
        p![run_id, excluding_turn.unwrap_or("")],
    )?;
    Ok(SessionSnapshot {
        status: head.status,
        counters: head.counters,
        mailbox: head.mailbox,
        buffered,
        wait,
        unseen_input,
    })
}

fn armed_wait(r: &Row) -> StoreResult<ArmedWait> {
    let spec: String = r.get(1)?;
    Ok(ArmedWait {
        id: r.get(0)?,
        spec: serde_json::from_str(&spec)
            .map_err(|e| StoreError::Database(format!("bad wait spec in the store: {e}")))?,
        deadline: r.get(2)?,
        interrupted_by: r.get(3)?,
        created_at: r.get(4)?,
    })
}

/// The signal already stored on the run under `signal_id`, as the raise rule compares it (name, and
/// its data as a placement: the referenced bytes, inline data, or none), with its stored envelope.
pub(super) fn first_signal(
    c: &dyn Db,
    run_id: &str,
    signal_id: &str,
) -> StoreResult<Option<(FirstSignal, Value)>> {
    let Some(env) = c.value::<String>(
        "SELECT envelope FROM signals WHERE run_id = ?1 AND signal_id = ?2",
        p![run_id, signal_id],
    )?
    else {
        return Ok(None);
    };
    let env = read::json(env);
    let data = match (
        env.get("payloadRef").and_then(Value::as_str),
        env.get("data"),
    ) {
        (Some(r), _) => DataPlacement::Reference(signal_payload(c, run_id, r)?),
        (None, Some(d)) => DataPlacement::Inline(d.clone()),
        (None, None) => DataPlacement::None,
    };
    let name = env["name"].as_str().unwrap_or_default().to_string();
    Ok(Some((FirstSignal { name, data }, env)))
}

/// The head of the run's turn queue: its lowest-`seq` turn that is `queued` or `leased`.
pub(super) fn head_turn(c: &dyn Db, run_id: &str) -> StoreResult<Option<HeadTurn>> {
    c.row(
        "SELECT id, state, lease_until, claims FROM turns WHERE run_id = ?1 AND state IN ('queued', 'leased') \
         ORDER BY seq LIMIT 1",
        p![run_id],
        |r| {
            let state: String = r.get(1)?;
            Ok(HeadTurn {
                id: r.get(0)?,
                state: TurnState::parse(&state).ok_or_else(|| read::bad("turn state", &state))?,
                lease_until: r.get(2)?,
                claims: r.get(3)?,
            })
        },
    )
}

/// The turn being acknowledged, by `(id, run_id)`. Errors: `NotFound("turn")`.
pub(super) fn acked_turn(c: &dyn Db, run_id: &str, turn_id: &str) -> StoreResult<AckedTurn> {
    c.row(
        "SELECT id, kind, state, claims, delivery_id FROM turns WHERE id = ?1 AND run_id = ?2",
        p![turn_id, run_id],
        |r| {
            let kind: String = r.get(1)?;
            let state: String = r.get(2)?;
            Ok(AckedTurn {
                id: r.get(0)?,
                kind: TurnKind::parse(&kind).ok_or_else(|| read::bad("turn kind", &kind))?,
                state: TurnState::parse(&state).ok_or_else(|| read::bad("turn state", &state))?,
                claims: r.get(3)?,
                delivery_id: r.get(4)?,
            })
        },
    )?
    .ok_or_else(|| StoreError::not_found(RecordKind::Turn))
}

/// The run's turns not yet acknowledged (`queued` or `leased`), by `seq` (what `session::end` expires).
pub(super) fn open_turns(c: &dyn Db, run_id: &str) -> StoreResult<Vec<OpenTurn>> {
    c.rows(
        "SELECT id, delivery_id FROM turns WHERE run_id = ?1 AND state IN ('queued', 'leased') ORDER BY seq",
        p![run_id],
        |r| {
            Ok(OpenTurn {
                id: r.get(0)?,
                delivery_id: r.get(1)?,
            })
        },
    )
}

/// A stored wait's state, by `(id, run_id)`. Errors: `NotFound("wait")`.
pub(super) fn wait_state(c: &dyn Db, run_id: &str, wait_id: &str) -> StoreResult<WaitState> {
    let s: String = c
        .value(
            "SELECT state FROM waits WHERE id = ?1 AND run_id = ?2",
            p![wait_id, run_id],
        )?
        .ok_or_else(|| StoreError::not_found(RecordKind::Wait))?;
    WaitState::parse(&s).ok_or_else(|| read::bad("wait state", &s))
}
