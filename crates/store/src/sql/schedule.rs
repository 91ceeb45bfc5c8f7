//! Schedule cursors: one row per schedule subscription, moved by compare-and-set on
//! `version`. The scheduler (`tb_engine::scheduler`) plans from a row and writes the planned cursor only
//! if nobody moved it meanwhile; the rules are `tb_core::schedule::plan`'s.

use super::Db;
use crate::model::ScheduleCursorRecord;
use crate::{p, StoreResult};
use tb_core::schedule::plan::Cursor;

const COLUMNS: &str =
    "subscription_id, last_nominal_at, missed_total, buffered_at, last_receipt_id, version, updated_at";

fn record(r: &super::Row) -> StoreResult<ScheduleCursorRecord> {
    Ok(ScheduleCursorRecord {
        subscription_id: r.get(0)?,
        cursor: Cursor {
            last_nominal_ms: r.get(1)?,
            missed_total: r.get::<i64>(2)?.max(0) as u64,
            buffered_ms: r.get(3)?,
            last_receipt: r.get(4)?,
        },
        version: r.get(5)?,
        updated_at: r.get(6)?,
    })
}

/// Every cursor, ordered by subscription id.
pub(crate) fn all(c: &dyn Db) -> StoreResult<Vec<ScheduleCursorRecord>> {
    c.rows(
        &format!("SELECT {COLUMNS} FROM schedule_cursors ORDER BY subscription_id"),
        p![],
        record,
    )
}

/// One cursor, if the schedule has one yet.
pub(crate) fn get(c: &dyn Db, id: &str) -> StoreResult<Option<ScheduleCursorRecord>> {
    c.row(
        &format!("SELECT {COLUMNS} FROM schedule_cursors WHERE subscription_id = ?1"),
        p![id],
        record,
    )
}

/// Compare-and-set: with `expected = None` creates the row (version 1) unless one exists; with
/// `Some(v)` replaces the row only while its version is still `v` (then `v + 1`). Returns whether this
/// call wrote: `false` means another loop moved the cursor first, and the caller re-reads.
pub(crate) fn put(
    c: &dyn Db,
    id: &str,
    cursor: &Cursor,
    expected: Option<i64>,
    now: i64,
) -> StoreResult<bool> {
    let missed = cursor.missed_total.min(i64::MAX as u64) as i64;
    let n = match expected {
        None => c.exec(
            &format!(
                "INSERT INTO schedule_cursors ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6) \
                 ON CONFLICT (subscription_id) DO NOTHING"
            ),
            p![
                id,
                cursor.last_nominal_ms,
                missed,
                cursor.buffered_ms,
                cursor.last_receipt.as_deref(),
                now
            ],
        )?,
        Some(v) => c.exec(
            "UPDATE schedule_cursors SET last_nominal_at = ?2, missed_total = ?3, buffered_at = ?4, \
             last_receipt_id = ?5, version = version + 1, updated_at = ?6 \
             WHERE subscription_id = ?1 AND version = ?7",
            p![
                id,
                cursor.last_nominal_ms,
                missed,
                cursor.buffered_ms,
                cursor.last_receipt.as_deref(),
                now,
                v
            ],
        )?,
    };
    Ok(n == 1)
}
