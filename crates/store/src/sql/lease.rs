//! Delivery leases: granting, renewing and releasing them. The rules (which deliveries are leasable,
//! when a renewal or release is still the holder's, the fencing token) are `tb_core::lease`'s; this
//! module loads the delivery row under its lock, calls them, and writes with an `UPDATE` fenced on the
//! token (zero rows updated = the race was lost = [`StoreError::LeaseLost`]).
//!
//! Clock: every `now` is the caller's (Unix ms), as the worker passes it; replicas are expected to keep
//! their clocks close (NTP). A skew shortens or lengthens a lease by the skew, never lets two holders
//! both commit: the token fences every write.

use crate::p;
use crate::sql::{Db, Dialect};
use tb_core::lease::{self, LeaseLost, LeaseRow};

use super::read;
use crate::model::*;
use crate::{RecordKind, StoreError, StoreResult};

/// Grants leases of `lease_ms` (ms) at `now` (Unix ms) on up to `limit` due deliveries to `owner` (for
/// display), under one freshly minted token ([`lease::grant`]; a later grant on a row always mints a new
/// one). A lease moves `due_at` to the lease's end, so a leased delivery is simply not due until its
/// lease lapses and the due index alone finds work. On SQLite the index is named (without statistics
/// the planner prefers deliveries_by_state and sorts every open row); on PostgreSQL the rows are taken
/// with SKIP LOCKED so replicas leasing at once take disjoint batches.
pub(crate) fn lease_due(
    c: &dyn Db,
    owner: &str,
    now: i64,
    lease_ms: u64,
    limit: u32,
) -> StoreResult<Vec<Lease>> {
    let g = lease::grant(now, lease_ms);
    let pick = match c.dialect() {
        Dialect::Sqlite => {
            "SELECT id FROM deliveries INDEXED BY deliveries_due \
             WHERE state IN ('pending','retrying') AND due_at <= ?4 ORDER BY due_at LIMIT ?5"
        }
        Dialect::Postgres => {
            "SELECT id FROM deliveries \
             WHERE state IN ('pending','retrying') AND due_at <= ?4 ORDER BY due_at LIMIT ?5 \
             FOR UPDATE SKIP LOCKED"
        }
    };
    let sql = format!(
        "UPDATE deliveries SET lease_owner = ?1, lease_token = ?2, lease_until = ?3, due_at = ?6 \
         WHERE id IN ({pick}) RETURNING {}",
        read::DELIVERY_COLS
    );
    let rows = c.rows(
        &sql,
        p![owner, g.token, g.until, now, limit, g.due_at],
        read::delivery_row,
    )?;
    Ok(rows
        .into_iter()
        .map(|delivery| Lease {
            delivery,
            owner: owner.to_string(),
            token: g.token.clone(),
            lease_until: g.until,
            lease_ms,
        })
        .collect())
}

/// The delivery with its lease columns, its row locked until the transaction ends (`FOR UPDATE` on
/// PostgreSQL). Errors: `NotFound("delivery")`.
pub(crate) fn lock_lease(c: &dyn Db, id: &str) -> StoreResult<(DeliveryRecord, LeaseRow)> {
    let sql = format!(
        "SELECT {}, lease_token FROM deliveries WHERE id = ?1{}",
        read::DELIVERY_COLS,
        c.dialect().for_update()
    );
    c.row(&sql, p![id], |r| {
        let d = read::delivery_row(r)?;
        let row = LeaseRow {
            state: d.state,
            attempts: d.attempts,
            token: r.get(read::DELIVERY_COLS_LEN)?,
            until: d.lease_until,
        };
        Ok((d, row))
    })?
    .ok_or_else(|| StoreError::not_found(RecordKind::Delivery))
}

/// A refused lease write: the store's [`StoreError::LeaseLost`] for delivery `id`.
pub(crate) fn lost(id: &str) -> impl Fn(LeaseLost) -> StoreError + '_ {
    move |_| StoreError::LeaseLost(id.to_string())
}

/// Renews grant `token`'s lease on delivery `id` by `lease_ms` (ms) from `now` (Unix ms) and returns
/// its new end ([`lease::renew`]). Errors: `LeaseLost` (another token, terminal, lapsed), `NotFound`.
pub(crate) fn renew_lease(
    c: &dyn Db,
    id: &str,
    token: &str,
    now: i64,
    lease_ms: u64,
) -> StoreResult<i64> {
    let (_, row) = lock_lease(c, id)?;
    let r = lease::renew(&row, token, now, lease_ms).map_err(lost(id))?;
    let n = c.exec(
        "UPDATE deliveries SET lease_until = ?3, due_at = ?4 WHERE id = ?1 AND lease_token = ?2",
        p![id, token, r.until, r.due_at],
    )?;
    lease::fenced(n).map_err(lost(id))?;
    Ok(r.until)
}

/// Gives delivery `id` back without an attempt: due again at `now` (Unix ms), owner, token and end
/// cleared ([`lease::release`]). Errors: `LeaseLost` (another token, terminal), `NotFound`.
pub(crate) fn release_lease(c: &dyn Db, id: &str, token: &str, now: i64) -> StoreResult<()> {
    let (_, row) = lock_lease(c, id)?;
    let due = lease::release(&row, token, now).map_err(lost(id))?;
    let n = c.exec(
        "UPDATE deliveries SET lease_owner = NULL, lease_token = NULL, lease_until = NULL, due_at = ?3 \
         WHERE id = ?1 AND lease_token = ?2",
        p![id, token, due],
    )?;
    lease::fenced(n).map_err(lost(id))
}
