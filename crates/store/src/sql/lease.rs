//! Delivery leases: granting, renewing and releasing them. The rules (which deliveries are leasable,
//! when a renewal or release is still the holder's, the fencing token) are `tb_core::lease`'s; this
//! module loads the delivery row under its lock, calls them, and writes with an `UPDATE` fenced on the
//! token (zero rows updated = the race was lost = [`StoreError::LeaseLost`]).
//!
//! Clock: every `now` is the caller's (Unix ms), as the worker passes it; replicas are expected to keep
//! their clocks close (NTP). A skew shortens or lengthens a lease by the skew, never lets two holders
//! both commit: the token fences every write.

use std::collections::HashMap;

use crate::p;
use crate::sql::{Db, Dialect};
use tb_core::delivery::DeliveryState;
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::{self, LeaseLost, LeaseRow};

use super::log::insert_attempt;
use super::read;
use crate::model::*;
use crate::{RecordKind, StoreError, StoreResult};

/// Grants leases of `lease_ms` (ms) at `now` (Unix ms) on up to `limit` due deliveries to `owner` (for
/// display), under one freshly minted token ([`lease::grant`]; a later grant on a row always mints a new
/// one). A lease moves `due_at` to the lease's end, so a leased delivery is simply not due until its
/// lease lapses and the due index alone finds work. On SQLite the index is named (without statistics
/// the planner prefers deliveries_by_state and sorts every open row); on PostgreSQL the rows are taken
/// with SKIP LOCKED so replicas leasing at once take disjoint batches.
///
/// Statements: the due rows are picked with their lease columns (locked on PostgreSQL); for each row
/// whose earlier grant lapsed with no outcome recorded ([`lease::take_over`]) the abandoned attempt is
/// written as the rule says ([`tb_core::attempt::lost`]: its `attempts` row, outcome `lost`, and the
/// delivery's attempt count); then one `UPDATE` grants the lease on the picked ids (a JSON array
/// parameter), all in this transaction. The leases come back in due order; [`Lease::lost`] names a
/// taken-over attempt.
pub(crate) fn lease_due(
    c: &dyn Db,
    owner: &str,
    now: i64,
    lease_ms: u64,
    limit: u32,
) -> StoreResult<Vec<Lease>> {
    let pick = match c.dialect() {
        Dialect::Sqlite => {
            "SELECT id, state, attempts, lease_token, lease_until, first_attempt_at \
             FROM deliveries INDEXED BY deliveries_due \
             WHERE state IN ('pending','retrying') AND due_at <= ?1 ORDER BY due_at LIMIT ?2"
        }
        Dialect::Postgres => {
            "SELECT id, state, attempts, lease_token, lease_until, first_attempt_at FROM deliveries \
             WHERE state IN ('pending','retrying') AND due_at <= ?1 ORDER BY due_at LIMIT ?2 \
             FOR UPDATE SKIP LOCKED"
        }
    };
    let picked = c.rows(pick, p![now, limit], |r| {
        let state: String = r.get(1)?;
        let row = LeaseRow {
            state: DeliveryState::parse(&state)
                .ok_or_else(|| read::bad("delivery state", &state))?,
            attempts: r.get(2)?,
            token: r.get(3)?,
            until: r.get(4)?,
        };
        Ok((r.get::<String>(0)?, row, r.get::<Option<i64>>(5)?))
    })?;
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let mut lost = HashMap::new();
    for (id, row, first_attempt_at) in &picked {
        let Some(abandoned) = lease::take_over(row, now) else {
            continue;
        };
        let w = tb_core::attempt::lost(
            id,
            *first_attempt_at,
            &abandoned,
            new_id(IdKind::Event),
            now,
        );
        // The row is locked (PostgreSQL) or the writer is alone (SQLite): nothing moved since the pick.
        c.exec(
            "UPDATE deliveries SET attempts = ?2, first_attempt_at = ?3, last_error = ?4, updated_at = ?5 \
             WHERE id = ?1",
            p![id, w.attempts, w.first_attempt_at, w.last_error, w.updated_at],
        )?;
        insert_attempt(c, &w.attempt)?;
        lost.insert(id.as_str(), abandoned.attempt);
    }
    let g = lease::grant(now, lease_ms);
    let ids: Vec<&str> = picked.iter().map(|(id, ..)| id.as_str()).collect();
    let ids_json = serde_json::to_string(&ids).expect("ids serialize");
    let in_ids = match c.dialect() {
        Dialect::Sqlite => "SELECT value FROM json_each(?5)",
        Dialect::Postgres => "SELECT json_array_elements_text(CAST(?5 AS TEXT)::json)",
    };
    let sql = format!(
        "UPDATE deliveries SET lease_owner = ?1, lease_token = ?2, lease_until = ?3, due_at = ?4 \
         WHERE id IN ({in_ids}) RETURNING {}",
        read::DELIVERY_COLS
    );
    let mut rows = c.rows(
        &sql,
        p![owner, g.token, g.until, g.due_at, ids_json],
        read::delivery_row,
    )?;
    let order: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    rows.sort_by_key(|d| order.get(d.id.as_str()).copied().unwrap_or(usize::MAX));
    Ok(rows
        .into_iter()
        .map(|delivery| Lease {
            lost: lost.get(delivery.id.as_str()).copied(),
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
