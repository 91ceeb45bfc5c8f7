//! Registered `triggers.v2` services (issue #12): manifests and heartbeats, one row per service.

use super::Db;
use crate::model::ServiceRecord;
use crate::{p, StoreResult};

const COLUMNS: &str = "name, service_version, manifest, manifest_hash, registered_at, \
     last_heartbeat_at, started_at, heartbeat_hash, shutting_down";

fn record(r: &super::Row) -> StoreResult<ServiceRecord> {
    let manifest: String = r.get(2)?;
    Ok(ServiceRecord {
        name: r.get(0)?,
        service_version: r.get(1)?,
        manifest: serde_json::from_str(&manifest).unwrap_or(serde_json::Value::Null),
        manifest_hash: r.get(3)?,
        registered_at: r.get(4)?,
        last_heartbeat_at: r.get(5)?,
        started_at: r.get(6)?,
        heartbeat_hash: r.get(7)?,
        shutting_down: r.get::<i64>(8)? != 0,
    })
}

/// Stores (or replaces) a service's manifest; its heartbeat state is kept.
pub(crate) fn register(
    c: &dyn Db,
    name: &str,
    version: &str,
    manifest: &str,
    hash: &str,
    now: i64,
) -> StoreResult<ServiceRecord> {
    c.exec(
        "INSERT INTO services (name, service_version, manifest, manifest_hash, registered_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (name) DO UPDATE SET \
         service_version = excluded.service_version, manifest = excluded.manifest, \
         manifest_hash = excluded.manifest_hash, registered_at = excluded.registered_at",
        p![name, version, manifest, hash, now],
    )?;
    get(c, name)?.ok_or_else(|| crate::StoreError::Database("service row vanished".into()))
}

/// One service, if registered.
pub(crate) fn get(c: &dyn Db, name: &str) -> StoreResult<Option<ServiceRecord>> {
    c.row(
        &format!("SELECT {COLUMNS} FROM services WHERE name = ?1"),
        p![name],
        record,
    )
}

/// Every service, by name.
pub(crate) fn all(c: &dyn Db) -> StoreResult<Vec<ServiceRecord>> {
    c.rows(
        &format!("SELECT {COLUMNS} FROM services ORDER BY name"),
        p![],
        record,
    )
}

/// Records a heartbeat of a registered service; false when the service is not registered.
pub(crate) fn heartbeat(
    c: &dyn Db,
    name: &str,
    started_at: &str,
    hash: &str,
    shutting_down: bool,
    now: i64,
) -> StoreResult<bool> {
    let n = c.exec(
        "UPDATE services SET last_heartbeat_at = ?2, started_at = ?3, heartbeat_hash = ?4, \
         shutting_down = ?5 WHERE name = ?1",
        p![name, now, started_at, hash, shutting_down as i64],
    )?;
    Ok(n == 1)
}
