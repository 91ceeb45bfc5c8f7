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

mod capabilities;
mod effects;
mod signals;
mod turns;
pub(crate) mod waits;

use crate::model::*;
use crate::session::*;
use crate::{StoreError, StoreResult};
pub(crate) use capabilities::*;
pub(crate) use effects::*;
pub(crate) use signals::*;
pub(crate) use turns::*;
pub(crate) use waits::*;

pub(super) fn rejected(code: ErrorCode, message: impl Into<String>) -> StoreError {
    StoreError::Rejected {
        code,
        message: message.into(),
    }
}

pub(super) fn json_col(s: Option<String>) -> Option<Value> {
    s.map(read::json)
}

pub(super) use crate::model::rfc3339;

/// The run, which must exist and not be terminal. Errors: `NotFound`; `Rejected(target_terminal)`.
pub(super) fn live_run(c: &Connection, run_id: &str) -> StoreResult<RunRecord> {
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

pub(super) fn set_status(
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
pub(super) fn consume_delivery(
    c: &Connection,
    delivery_id: Option<&str>,
    now: i64,
) -> StoreResult<()> {
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
