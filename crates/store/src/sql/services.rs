//! Registered `triggers.v2` services: manifests and heartbeats, one row per service
//! (the last heartbeat of any replica) and one per replica (`service_replicas`, keyed by the
//! replica's `started_at`).

use super::Db;
use crate::model::{ReplicaRecord, ServiceRecord};
use crate::{p, StoreResult};

const COLUMNS: &str = "name, service_version, manifest, manifest_hash, registered_at, \
     last_heartbeat_at, started_at, heartbeat_hash, shutting_down";

/// A replica silent this long (ms) is removed by the next heartbeat of its service: 1 hour.
pub(crate) const REPLICA_KEPT_MS: i64 = 3_600_000;

fn replicas(c: &dyn Db, name: &str) -> StoreResult<Vec<ReplicaRecord>> {
    c.rows(
        "SELECT started_at, manifest_hash, last_heartbeat_at, shutting_down FROM service_replicas \
         WHERE service = ?1 ORDER BY started_at",
        p![name],
        |r| {
            Ok(ReplicaRecord {
                started_at: r.get(0)?,
                manifest_hash: r.get(1)?,
                last_heartbeat_at: r.get(2)?,
                shutting_down: r.get::<i64>(3)? != 0,
            })
        },
    )
}

fn with_replicas(c: &dyn Db, mut s: ServiceRecord) -> StoreResult<ServiceRecord> {
    s.replicas = replicas(c, &s.name)?;
    Ok(s)
}

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
        replicas: Vec::new(),
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

/// One service, if registered, with its replicas.
pub(crate) fn get(c: &dyn Db, name: &str) -> StoreResult<Option<ServiceRecord>> {
    c.row(
        &format!("SELECT {COLUMNS} FROM services WHERE name = ?1"),
        p![name],
        record,
    )?
    .map(|s| with_replicas(c, s))
    .transpose()
}

/// Every service, by name, with its replicas.
pub(crate) fn all(c: &dyn Db) -> StoreResult<Vec<ServiceRecord>> {
    c.rows(
        &format!("SELECT {COLUMNS} FROM services ORDER BY name"),
        p![],
        record,
    )?
    .into_iter()
    .map(|s| with_replicas(c, s))
    .collect()
}

/// Records a heartbeat of a registered service (its row and its replica's, removing replicas silent
/// for [`REPLICA_KEPT_MS`]); false when the service is not registered.
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
    if n != 1 {
        return Ok(false);
    }
    c.exec(
        "INSERT INTO service_replicas (service, started_at, manifest_hash, last_heartbeat_at, \
         shutting_down) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (service, started_at) DO UPDATE SET \
         manifest_hash = excluded.manifest_hash, last_heartbeat_at = excluded.last_heartbeat_at, \
         shutting_down = excluded.shutting_down",
        p![name, started_at, hash, now, shutting_down as i64],
    )?;
    c.exec(
        "DELETE FROM service_replicas WHERE service = ?1 AND last_heartbeat_at < ?2",
        p![name, now - REPLICA_KEPT_MS],
    )?;
    Ok(true)
}
