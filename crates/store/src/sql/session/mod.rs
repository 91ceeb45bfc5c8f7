//! Sessions, backend-neutral: signals (per-run FIFO mailbox), waits, turns, coalescing and capability
//! endpoints. Every function runs inside one backend transaction; an `Err` rolls back its writes.
//!
//! Each session operation has the same three steps (DESIGN §9 "Session rules in core"): lock the run row
//! and load what the rule reads ([`snapshot`]), call the pure rule in `tb_core` (`signal::raise`,
//! `turn::{enqueue, claim, ack}`, `wait::{arm, cancel, step}`, `session::{start, end}`,
//! `binding::{coalesce, join, target}`), and apply the `Writes` it returned ([`apply`]). Nothing here
//! decides: the code loads, locks and writes.

use crate::p;
use crate::sql::Db;
use serde_json::Value;
use tb_core::ids::{new_id, IdKind};
use tb_core::session::{Ctx, Refusal};
use tb_core::turn::{TurnKind, TurnState};
use tb_core::wait::{WaitKind, WaitState};

use super::read::{self, no_row};

mod apply;
mod capabilities;
mod effects;
mod signals;
mod snapshot;
mod turns;
pub(crate) mod waits;

use crate::model::*;
use crate::session::*;
use crate::{RecordKind, StoreError, StoreResult};
pub(crate) use capabilities::*;
pub(crate) use effects::*;
pub(crate) use signals::*;
pub(crate) use turns::*;
pub(crate) use waits::*;

pub(super) use crate::model::rfc3339;

pub(super) fn rejected(code: tb_core::ErrorCode, message: impl Into<String>) -> StoreError {
    StoreError::Rejected {
        code,
        message: message.into(),
    }
}

/// A rule's refusal as the store's error: `Rejected { code, message }` or `Conflict(message)`.
pub(super) fn refused(r: Refusal) -> StoreError {
    match r {
        Refusal::Rejected { code, message } => StoreError::Rejected { code, message },
        Refusal::Conflict(m) => StoreError::Conflict(m),
    }
}

pub(super) fn json_col(s: Option<String>) -> Option<Value> {
    s.map(read::json)
}

/// Runs a rule with the context of one store call: the time `now` (Unix ms) and fresh turn ids
/// (`turn_...`, [`new_id`]).
pub(super) fn with_ctx<T>(now: i64, f: impl FnOnce(&mut Ctx) -> T) -> T {
    let mut mint = || new_id(IdKind::Turn);
    let mut ctx = Ctx {
        now,
        new_turn_id: &mut mint,
    };
    f(&mut ctx)
}

/// The run, which must exist and be live (`tb_core::session::live`), locked for the rest of the
/// transaction ([`read::lock_run`]). Errors: `NotFound("run")`; `Rejected(target_terminal)`.
pub(super) fn live_run(c: &dyn Db, run_id: &str) -> StoreResult<RunRecord> {
    let run = read::lock_run(c, run_id)?;
    tb_core::session::live(run.status).map_err(refused)?;
    Ok(run)
}

/// Marks a delivery's effect consumed (once) and settles its receipt (`log::settle_receipt`).
pub(super) fn consume_delivery(c: &dyn Db, delivery_id: &str, now: i64) -> StoreResult<()> {
    let receipt = c.row(
        "UPDATE deliveries SET consumed_at = ?2 WHERE id = ?1 AND consumed_at IS NULL RETURNING receipt_id",
        p![delivery_id, now],
        |r| r.get::<String>(0),
    )?;
    if let Some(receipt) = receipt {
        super::log::settle_receipt(c, &receipt, now)?;
    }
    Ok(())
}
