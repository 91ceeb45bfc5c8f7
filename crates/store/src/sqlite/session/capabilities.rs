//! Capability endpoints on SQLite: minted records (token hash only), use counts, revocation.

use super::*;

pub(super) const CAP_COLS: &str = "id, run_id, signal, label, wake, hmac_file, created_by, created_at, expires_at, max_uses, use_count, revoked_at";

pub(super) fn cap_row(r: &Row) -> rusqlite::Result<CapabilityRecord> {
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
    c: &Connection,
    cap: &CapabilityRecord,
    token_hash: &str,
) -> StoreResult<()> {
    live_run(c, &cap.run_id)?;
    c.prepare_cached(&format!(
        "INSERT INTO capabilities ({CAP_COLS}, token_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 0, NULL, ?11)"
    ))
    .map_err(db)?
    .execute(params![
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
    ])
    .map_err(db)?;
    Ok(())
}

pub(crate) fn list_capabilities(c: &Connection) -> StoreResult<Vec<CapabilityRecord>> {
    let mut st = c
        .prepare_cached(&format!(
            "SELECT {CAP_COLS} FROM capabilities ORDER BY created_at DESC, id DESC"
        ))
        .map_err(db)?;
    let rows = st.query_map([], cap_row).map_err(db)?;
    rows.collect::<Result<_, _>>().map_err(db)
}

/// A usable endpoint by token hash: not revoked, not expired, uses left. `None` for all four failures
/// alike (signals-and-connectors §4.2: the same 404).
pub(crate) fn capability_by_hash(
    c: &Connection,
    token_hash: &str,
    now: i64,
) -> StoreResult<Option<CapabilityRecord>> {
    c.prepare_cached(&format!(
        "SELECT {CAP_COLS} FROM capabilities WHERE token_hash = ?1 AND revoked_at IS NULL AND expires_at > ?2 AND use_count < max_uses"
    ))
    .map_err(db)?
    .query_row(params![token_hash, now], cap_row)
    .optional()
    .map_err(db)
}

/// Counts one use inside the receipt's transaction. Errors: `Rejected(not_found)` when the endpoint was
/// revoked, expired or used up meanwhile (nothing is committed).
pub(crate) fn use_capability(c: &Connection, id: &str, now: i64) -> StoreResult<()> {
    let n = c
        .prepare_cached("UPDATE capabilities SET use_count = use_count + 1 WHERE id = ?1 AND revoked_at IS NULL AND expires_at > ?2 AND use_count < max_uses")
        .map_err(db)?
        .execute(params![id, now])
        .map_err(db)?;
    if n == 0 {
        return Err(rejected(ErrorCode::NotFound, "no such endpoint"));
    }
    Ok(())
}

/// Revokes an endpoint at once; revoking again keeps the first `revoked_at`. Errors: `NotFound`.
pub(crate) fn revoke_capability(
    c: &Connection,
    id: &str,
    now: i64,
) -> StoreResult<CapabilityRecord> {
    c.prepare_cached(
        "UPDATE capabilities SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
    )
    .map_err(db)?
    .execute(params![id, now])
    .map_err(db)?;
    c.prepare_cached(&format!(
        "SELECT {CAP_COLS} FROM capabilities WHERE id = ?1"
    ))
    .map_err(db)?
    .query_row([id], cap_row)
    .optional()
    .map_err(db)?
    .ok_or_else(|| StoreError::NotFound("capability endpoint".into()))
}
