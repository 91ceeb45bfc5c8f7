//! Sessions on SQLite: signals (per-run FIFO mailbox), waits and their resolution, turns, coalescing and
//! capability endpoints. Every function runs inside the writer's batch transaction (its own savepoint);
//! an `Err` rolls back just that function's writes. The resolution RULE lives in `tb_core::wait`; this
//! file only gathers the candidates and applies the outcome.

use crate::p;
use crate::sql::Db;
use serde_json::{json, Value};
use tb_core::ids::{new_id, IdKind};
use tb_core::run::RunStatus;
use tb_core::signal::{admit, Admit, DataPlacement, MailboxPolicy, SessionSignalV1};
use tb_core::turn::{self, TurnKind, TurnState};
use tb_core::wait::{self, Candidates, Resolution, WaitKind, WaitSpec, WaitState, WinnerKind};
use tb_core::ErrorCode;

use super::read::{self, no_row};
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

/// The run, which must exist and not be terminal, locked for the rest of the transaction
/// ([`read::lock_run`]). Errors: `NotFound`; `Rejected(target_terminal)`.
pub(super) fn live_run(c: &dyn Db, run_id: &str) -> StoreResult<RunRecord> {
    let run = read::lock_run(c, run_id)?;
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
    c: &dyn Db,
    run_id: &str,
    ty: &str,
    payload: &Value,
    now: i64,
) -> StoreResult<()> {
    let seq: i64 = c
        .row(
            "UPDATE runs SET next_sequence = next_sequence + 1, updated_at = ?2 WHERE id = ?1 RETURNING next_sequence - 1", p![run_id, now], |r| r.get(0))?.ok_or_else(no_row)?;
    write::insert_run_event(c, run_id, seq as u64, ty, payload, None, now)
}

pub(super) fn set_status(
    c: &dyn Db,
    run_id: &str,
    status: RunStatus,
    reason: Option<&str>,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "UPDATE runs SET status = ?2, wait_reason = ?3, updated_at = ?4 WHERE id = ?1",
        p![run_id, status.as_str(), reason, now],
    )?;
    Ok(())
}

/// Marks a delivery's effect consumed and settles its receipt.
pub(super) fn consume_delivery(c: &dyn Db, delivery_id: Option<&str>, now: i64) -> StoreResult<()> {
    let Some(d) = delivery_id else { return Ok(()) };
    let n = c
        .row("UPDATE deliveries SET consumed_at = ?2 WHERE id = ?1 AND consumed_at IS NULL RETURNING receipt_id", p![d, now], |r| r.get::<String>(0))?;
    if let Some(receipt) = n {
        write::settle_receipt(c, &receipt, now)?;
    }
    Ok(())
}
