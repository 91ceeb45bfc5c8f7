//! Capability endpoints: minted records (token hash only), use counts, revocation.

use super::*;
use crate::p;
use crate::sql::{Db, Row};

pub(super) const CAP_COLS: &str = "id, run_id, signal, label, wake, hmac_file, created_by, created_at, expires_at, max_uses, use_count, revoked_at";

pub(super) fn cap_row(r: &Row) -> StoreResult<CapabilityRecord> {
    let hmac_file: Option<String> = r.get(5)?;
    Ok(CapabilityRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        signal: r.get(2)?,
        label: r.get(3)?,
        wake: r.get(4)?,
        hmac: hmac_file.is_some(),
        hmac_file,
        created_by: r.get(6)?,
        created_at: r.get(7)?,
        expires_at: r.get(8)?,
        max_uses: r.get(9)?,
        use_count: r.get(10)?,
        revoked_at: r.get(11)?,
    })
}

/// Stores a minted endpoint (its token only as `token_hash`). Errors: `NotFound` for an unknown run;
/// `Rejected(target_terminal)` for an ended one.
pub(crate) fn create_capability(
    c: &dyn Db,
    cap: &CapabilityRecord,
    token_hash: &str,
) -> StoreResult<()> {
    live_run(c, &cap.run_id)?;
    c.exec(&format!(
        "INSERT INTO capabilities ({CAP_COLS}, token_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0, NULL, ?11)"
    ), p![
        cap.id,
        cap.run_id,
        cap.signal,
        cap.label,
        cap.wake,
        cap.hmac_file,
        cap.created_by,
        cap.created_at,
        cap.expires_at,
        cap.max_uses,
        token_hash
    ])?;
    Ok(())
}

pub(crate) fn list_capabilities(c: &dyn Db) -> StoreResult<Vec<CapabilityRecord>> {
    c.rows(
        &format!("SELECT {CAP_COLS} FROM capabilities ORDER BY created_at DESC, id DESC"),
        p![],
        cap_row,
    )
}

/// A usable endpoint by token hash: not revoked, not expired, uses left. `None` for all four failures
/// alike (signals-and-connectors §4.2: the same 404).
pub(crate) fn capability_by_hash(
    c: &dyn Db,
    token_hash: &str,
    now: i64,
) -> StoreResult<Option<CapabilityRecord>> {
    c.row(&format!(
        "SELECT {CAP_COLS} FROM capabilities WHERE token_hash = ?1 AND revoked_at IS NULL AND expires_at > ?2 AND use_count < max_uses"
    ), p![token_hash, now], cap_row)
}

/// Counts one use inside the receipt's transaction. Errors: `Rejected(not_found)` when the endpoint was
/// revoked, expired or used up meanwhile (nothing is committed).
pub(crate) fn use_capability(c: &dyn Db, id: &str, now: i64) -> StoreResult<()> {
    let n = c
        .exec("UPDATE capabilities SET use_count = use_count + 1 WHERE id = ?1 AND revoked_at IS NULL AND expires_at > ?2 AND use_count < max_uses", p![id, now])?;
    if n == 0 {
        return Err(rejected(tb_core::ErrorCode::NotFound, "no such endpoint"));
    }
    Ok(())
}

/// Revokes an endpoint at once; revoking again keeps the first `revoked_at`. Errors: `NotFound`.
pub(crate) fn revoke_capability(c: &dyn Db, id: &str, now: i64) -> StoreResult<CapabilityRecord> {
    c.exec(
        "UPDATE capabilities SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        p![id, now],
    )?;
    c.row(
        &format!("SELECT {CAP_COLS} FROM capabilities WHERE id = ?1"),
        p![id],
        cap_row,
    )?
    .ok_or_else(|| StoreError::not_found(RecordKind::Capability))
}
