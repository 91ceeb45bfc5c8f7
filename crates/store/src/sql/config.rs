//! The configuration another replica must see (DESIGN §9 "Configuration across replicas"):
//! the change log `config_changes`, appended in the SAME transaction as each change, and the sealed
//! secrets of registrations and outbound webhooks.
//!
//! The change-making writes themselves stay in [`write`] / [`session`]; each wrapper here runs one of
//! them and appends its change row when something changed, inside the caller's transaction. Ids come
//! from the one-row counter `config_change_seq` (`UPDATE ... RETURNING`): on PostgreSQL its row lock
//! holds the next appender until this transaction commits, so ids become visible in increasing order
//! and a poller that read id N has seen every id below N (a sequence would hand out N+1 to a
//! transaction that may commit before N, and a poller reading `id > N` would skip N for ever). The
//! counter is the last row a change transaction locks (after delivery, run, receipt, subscription).

use super::{session, write, Db};
use crate::model::{SubscriptionDef, SubscriptionRecord, WebhookRecord};
use crate::session::CapabilityRecord;
use crate::sync::{ChangeKind, ConfigChange};
use crate::{p, StoreResult};
use tb_core::subscription::{SubscriptionInput, Transition};

/// Appends one change row; returns its id. Must run inside the transaction that made the change.
pub(crate) fn append(c: &dyn Db, kind: ChangeKind, record_id: &str, at: i64) -> StoreResult<i64> {
    let id: i64 = c
        .value(
            "UPDATE config_change_seq SET last = last + 1 WHERE id = 1 RETURNING last",
            p![],
        )?
        .ok_or_else(|| crate::StoreError::Database("config_change_seq has no row".into()))?;
    c.exec(
        "INSERT INTO config_changes (id, kind, record_id, at) VALUES (?1, ?2, ?3, ?4)",
        p![id, kind.as_str(), record_id, at],
    )?;
    if c.dialect() == super::Dialect::Postgres {
        // Sent at COMMIT (dropped on rollback): replicas listening read the log at once instead of at
        // their next tick. Only configuration changes notify, so the hot path never takes NOTIFY's
        // commit-time queue lock. The payload names the schema, so stores in other schemas ignore it.
        c.exec(
            "SELECT pg_notify('trigger_bridge_config', current_schema()::TEXT)",
            p![],
        )?;
    }
    Ok(id)
}

/// Changes with `id > after`, ascending, at most `limit` (primary-key range read).
pub(crate) fn changes_since(c: &dyn Db, after: i64, limit: u32) -> StoreResult<Vec<ConfigChange>> {
    c.rows(
        "SELECT id, kind, record_id, at FROM config_changes WHERE id > ?1 ORDER BY id LIMIT ?2",
        p![after, limit],
        |r| {
            Ok(ConfigChange {
                id: r.get(0)?,
                kind: crate::sync::ChangeKind::parse(&r.get::<String>(1)?),
                record_id: r.get(2)?,
                at: r.get(3)?,
            })
        },
    )
}

/// The id of the newest change (0 when none).
pub(crate) fn head(c: &dyn Db) -> StoreResult<i64> {
    Ok(
        c.value("SELECT last FROM config_change_seq WHERE id = 1", p![])?
            .unwrap_or(0),
    )
}

/// Stores (or replaces) a sealed secret under `id`.
pub(crate) fn put_sealed_secret(c: &dyn Db, id: &str, sealed: &[u8], now: i64) -> StoreResult<()> {
    c.exec(
        "INSERT INTO sealed_secrets (id, sealed, created_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET sealed = excluded.sealed, created_at = excluded.created_at",
        p![id, sealed, now],
    )?;
    Ok(())
}

/// The sealed secret stored under `id`, if any.
pub(crate) fn sealed_secret(c: &dyn Db, id: &str) -> StoreResult<Option<Vec<u8>>> {
    c.value("SELECT sealed FROM sealed_secrets WHERE id = ?1", p![id])
}

/// A registered subscription, its sealed secrets `(id, sealed)` and its change row.
pub(crate) fn register_subscription(
    c: &dyn Db,
    def: &SubscriptionDef,
    sealed: &[(String, Vec<u8>)],
    now: i64,
) -> StoreResult<SubscriptionRecord> {
    let rec = write::upsert_subscription(c, def, now)?;
    for (id, s) in sealed {
        put_sealed_secret(c, id, s, now)?;
    }
    append(c, ChangeKind::Registration, &def.id, now)?;
    Ok(rec)
}

/// The `config` of subscription `id`, its row locked for the rest of the transaction (PostgreSQL `FOR
/// UPDATE`; SQLite has one writer); `None` when there is no such row.
fn locked_config(c: &dyn Db, id: &str) -> StoreResult<Option<String>> {
    let lock = match c.dialect() {
        crate::sql::Dialect::Postgres => " FOR UPDATE",
        crate::sql::Dialect::Sqlite => "",
    };
    c.value(
        &format!("SELECT config FROM subscriptions WHERE id = ?1{lock}"),
        p![id],
    )
}

/// [`register_subscription`] for a rotation: the subscription row is locked first (PostgreSQL `FOR
/// UPDATE`; SQLite has one writer), the secret sealed under its id must still be `expected` (`None`:
/// none is, a registration whose secret is a file), else `Conflict` and nothing is written; `remove`
/// names sealed secrets deleted in the same commit.
pub(crate) fn rotate_subscription_secret(
    c: &dyn Db,
    def: &SubscriptionDef,
    expected: Option<&[u8]>,
    sealed: &[(String, Vec<u8>)],
    remove: &[String],
    now: i64,
) -> StoreResult<SubscriptionRecord> {
    if locked_config(c, &def.id)?.is_none() {
        return Err(crate::StoreError::not_found(
            crate::RecordKind::Subscription,
        ));
    }
    if sealed_secret(c, &def.id)?.as_deref() != expected {
        return Err(crate::StoreError::Conflict(format!(
            "the secret of {} changed meanwhile (another rotation committed first); read it again and rotate if still needed",
            def.id
        )));
    }
    for id in remove {
        c.exec("DELETE FROM sealed_secrets WHERE id = ?1", p![id])?;
    }
    register_subscription(c, def, sealed, now)
}

/// Deletes the sealed secret `previous_id` of subscription `id` once the overlap its row records
/// (`config.registration.previousSecretUntil`) has ended at `now` or is gone: the subscription row is
/// locked first, so a rotation committing meanwhile (which writes a new end) is never undone. Returns
/// whether a secret was deleted.
pub(crate) fn drop_ended_previous_secret(
    c: &dyn Db,
    id: &str,
    previous_id: &str,
    now: i64,
) -> StoreResult<bool> {
    let until = locked_config(c, id)?
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.pointer("/registration/previousSecretUntil")?.as_i64());
    if until.is_some_and(|u| tb_core::rotation::previous_accepted(u, now)) {
        return Ok(false);
    }
    Ok(c.exec("DELETE FROM sealed_secrets WHERE id = ?1", p![previous_id])? > 0)
}

/// [`write::insert_subscription`] plus its `registration` change row when it inserted.
pub(crate) fn register_new_subscription(
    c: &dyn Db,
    def: &SubscriptionDef,
    now: i64,
) -> StoreResult<Option<SubscriptionRecord>> {
    let rec = write::insert_subscription(c, def, now)?;
    if rec.is_some() {
        append(c, ChangeKind::Registration, &def.id, now)?;
    }
    Ok(rec)
}

/// Operator pause / resume ([`write::apply_subscription_input`]) plus its change row when the state
/// changed.
pub(crate) fn apply_subscription_input(
    c: &dyn Db,
    id: &str,
    input: SubscriptionInput,
    now: i64,
) -> StoreResult<Option<Transition>> {
    let t = write::apply_subscription_input(c, id, input, now)?;
    if t.is_some() {
        append(c, ChangeKind::Subscription, id, now)?;
    }
    Ok(t)
}

/// [`write::revoke_binding`] plus its change row when it changed something.
pub(crate) fn revoke_binding(
    c: &dyn Db,
    id: &str,
    by: Option<&str>,
    now: i64,
) -> StoreResult<bool> {
    let changed = write::revoke_binding(c, id, by, now)?;
    if changed {
        append(c, ChangeKind::Binding, id, now)?;
    }
    Ok(changed)
}

/// [`write::restore_binding`] plus its change row when it changed something (`now`: Unix ms).
pub(crate) fn restore_binding(c: &dyn Db, id: &str, now: i64) -> StoreResult<bool> {
    let changed = write::restore_binding(c, id)?;
    if changed {
        append(c, ChangeKind::Binding, id, now)?;
    }
    Ok(changed)
}

/// [`write::quarantine_subscription`] plus its change row when it changed something.
pub(crate) fn quarantine_subscription(
    c: &dyn Db,
    q: &crate::model::QuarantineRecord,
) -> StoreResult<bool> {
    let changed = write::quarantine_subscription(c, q)?;
    if changed {
        append(c, ChangeKind::Quarantine, &q.subscription_id, q.since)?;
    }
    Ok(changed)
}

/// [`write::release_subscription`] plus its change row when it changed something (`now`: Unix ms).
pub(crate) fn release_subscription(c: &dyn Db, id: &str, now: i64) -> StoreResult<bool> {
    let changed = write::release_subscription(c, id)?;
    if changed {
        append(c, ChangeKind::Quarantine, id, now)?;
    }
    Ok(changed)
}

/// [`write::create_webhook`], the webhook's sealed secrets (`(id, sealed)` pairs) and its change row.
pub(crate) fn create_webhook(
    c: &dyn Db,
    w: &WebhookRecord,
    sub: &SubscriptionDef,
    secrets: &[(String, Vec<u8>)],
) -> StoreResult<()> {
    write::create_webhook(c, w, sub)?;
    for (id, sealed) in secrets {
        put_sealed_secret(c, id, sealed, w.created_at)?;
    }
    append(c, ChangeKind::Webhook, &w.id, w.created_at)?;
    Ok(())
}

/// [`write::delete_webhook`] plus its change row (`now`: Unix ms).
pub(crate) fn delete_webhook(c: &dyn Db, id: &str, tenant: &str, now: i64) -> StoreResult<()> {
    write::delete_webhook(c, id, tenant)?;
    append(c, ChangeKind::Webhook, id, now)?;
    Ok(())
}

/// Capability revocation plus its change row.
pub(crate) fn revoke_capability(c: &dyn Db, id: &str, now: i64) -> StoreResult<CapabilityRecord> {
    let cap = session::revoke_capability(c, id, now)?;
    append(c, ChangeKind::Capability, id, now)?;
    Ok(cap)
}

/// The current time in Unix ms, for change rows of writes whose API carries no time.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
