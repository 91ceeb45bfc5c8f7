//! Versioned schema migrations of the PostgreSQL backend (`migrations/postgres/`), safe to run from
//! several replicas starting at once.

use postgres::Client;

use super::error::classify;
use crate::StoreResult;

/// The migrations, in order: `(version, SQL)`. Version 1 is the whole SQLite schema up to its version 7
/// (`migrations/sqlite/0001..0007`) in one file, since no PostgreSQL store predates it.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_init.sql")),
    (
        2,
        include_str!("../../migrations/postgres/0002_lease_token.sql"),
    ),
    (
        3,
        include_str!("../../migrations/postgres/0003_session_counters.sql"),
    ),
    (
        4,
        include_str!("../../migrations/postgres/0004_config_sync.sql"),
    ),
    (
        5,
        include_str!("../../migrations/postgres/0005_receipt_source_delivery_kind.sql"),
    ),
    (
        6,
        include_str!("../../migrations/postgres/0006_session_bytes.sql"),
    ),
    (
        7,
        include_str!("../../migrations/postgres/0007_receipt_deliveries.sql"),
    ),
    (
        8,
        include_str!("../../migrations/postgres/0008_schedule_cursors.sql"),
    ),
    (
        9,
        include_str!("../../migrations/postgres/0009_services.sql"),
    ),
    (
        10,
        include_str!("../../migrations/postgres/0010_service_replicas.sql"),
    ),
    (
        11,
        include_str!("../../migrations/postgres/0011_audit_console.sql"),
    ),
    (
        12,
        include_str!("../../migrations/postgres/0012_ingress_counts_quarantine.sql"),
    ),
    (
        13,
        include_str!("../../migrations/postgres/0013_delivery_trace_context.sql"),
    ),
    (
        14,
        include_str!("../../migrations/postgres/0014_audit_breaks.sql"),
    ),
    (
        15,
        include_str!("../../migrations/postgres/0015_receipt_body.sql"),
    ),
    (
        16,
        include_str!("../../migrations/postgres/0016_receipts_fillfactor.sql"),
    ),
];

/// The first of the two `pg_advisory_xact_lock(int4, int4)` keys that serialize migrations ("tbmg");
/// the second is a hash of the current schema, so stores in different schemas of one database (the
/// tests) do not wait for each other.
const LOCK_CLASS: i32 = 0x7462_6d67;

/// Applies the missing migrations to the schema `client` works in (its `search_path`), each in its own
/// transaction under a transaction-level advisory lock, and records each in
/// `schema_migrations(version, applied_at ms)`. Several processes may call this at once: the lock makes
/// them take turns and each re-reads the version under it, so every migration is applied exactly once
/// and none of the callers fails. Returns `(version before, version after)`; equal when nothing was to
/// do. Errors: typed by [`classify`]; a failed migration is rolled back whole. Blocking: do not call
/// on a Tokio runtime thread.
pub fn migrate(client: &mut Client) -> StoreResult<(i64, i64)> {
    let mut from = None;
    loop {
        let mut tx = client.transaction().map_err(|e| classify(&e))?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext(COALESCE(current_schema(), '')))",
            &[&LOCK_CLASS],
        )
        .map_err(|e| classify(&e))?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (\
                 version BIGINT PRIMARY KEY, \
                 applied_at BIGINT NOT NULL)",
        )
        .map_err(|e| classify(&e))?;
        let current: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
                &[],
            )
            .and_then(|r| r.try_get(0))
            .map_err(|e| classify(&e))?;
        let from = *from.get_or_insert(current);
        let Some(&(version, sql)) = MIGRATIONS.iter().find(|(v, _)| *v > current) else {
            tx.commit().map_err(|e| classify(&e))?;
            return Ok((from, current));
        };
        tx.batch_execute(sql).map_err(|e| {
            let e = classify(&e);
            tracing::error!(version, error = %e, "PostgreSQL migration failed; rolled back");
            e
        })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) \
             VALUES ($1, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)",
            &[&version],
        )
        .map_err(|e| classify(&e))?;
        tx.commit().map_err(|e| classify(&e))?;
        tracing::info!(version, "applied PostgreSQL migration");
    }
}

/// The version the schema of `client` is at (0 before any migration). Errors: typed by [`classify`].
pub fn schema_version(client: &mut Client) -> StoreResult<i64> {
    let exists: bool = client
        .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
        .and_then(|r| r.try_get(0))
        .map_err(|e| classify(&e))?;
    if !exists {
        return Ok(0);
    }
    client
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            &[],
        )
        .and_then(|r| r.try_get(0))
        .map_err(|e| classify(&e))
}
