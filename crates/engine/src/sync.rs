//! Configuration across replicas (DESIGN §9): every replica on one database polls the
//! store's change log ([`tb_store::Store::changes_since`]) every [`POLL_INTERVAL`] and refreshes exactly
//! the caches a change names, so a pause, a binding revocation, a registration or an outbound webhook
//! made through one replica takes effect on the others within one interval plus one read (< 1 s).
//!
//! Why a polled log: it is durable (a replica that was down or slow reads on from its last id, and
//! nothing is lost: a wake-up sent while nobody listened is not), it is one indexed range read on
//! both backends, and each change row is written in the same transaction as the change, so a replica
//! never sees the change without its row or the row without the change. On PostgreSQL the store also
//! offers a `LISTEN` hint (`tb_store::postgres::listen`): a change transaction notifies at COMMIT and
//! the task polls at once, cutting the delay from up to 250 ms to a few ms. A notification is lost
//! while a listener reconnects, so it is only ever a hint to poll now, never the record.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tb_core::TbError;
use tb_store::ChangeKind;

use crate::registration::SecretStore;
use crate::{store_err, Engine};

/// How often the change log is read.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// How often every cached subscription state is re-read as a whole (ms): states changed by the
/// delivery worker of another replica (`failed`, `dead-lettered`, breaker reset) write no change row
/// (they happen on the hot path), so a replica picks them up here.
pub const STATE_RESYNC_MS: u64 = 5_000;

/// Changes read per store call.
const PAGE: u32 = 256;

/// What one [`poll_once`] refreshed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Change rows read.
    pub changes: usize,
    /// Subscriptions whose state was re-read.
    pub subscriptions: BTreeSet<String>,
    /// Whether the binding revocations were reloaded.
    pub bindings: bool,
    /// Registrations reloaded.
    pub registrations: BTreeSet<String>,
    /// Whether the outbound webhooks were reloaded.
    pub webhooks: bool,
    /// Whether the quarantined subscriptions were reloaded.
    pub quarantines: bool,
}

/// Reads the changes after the engine's cursor and refreshes what they name: subscription states
/// (one row each), the binding revocations (one read), registrations (one subscription row and its
/// sealed secret each; needs `secrets`) and outbound webhooks (one list read). The cursor advances
/// only after every refresh succeeded, so a failed refresh is retried by the next poll. Errors: the
/// store's; the cursor is then left where it was.
pub async fn poll_once(engine: &Engine, secrets: Option<&SecretStore>) -> Result<Applied, TbError> {
    let mut out = Applied::default();
    loop {
        let after = engine.config_cursor.load(Ordering::Acquire);
        let page = engine
            .store
            .changes_since(after, PAGE)
            .await
            .map_err(store_err)?;
        let Some(last) = page.last().map(|c| c.id) else {
            return Ok(out);
        };
        let full = page.len() == PAGE as usize;
        let mut step = Applied {
            changes: page.len(),
            ..Default::default()
        };
        for c in page {
            match c.kind {
                Some(ChangeKind::Subscription) => {
                    step.subscriptions.insert(c.record_id);
                }
                Some(ChangeKind::Binding) => step.bindings = true,
                Some(ChangeKind::Registration) => {
                    step.registrations.insert(c.record_id);
                }
                Some(ChangeKind::Webhook) => step.webhooks = true,
                Some(ChangeKind::Quarantine) => step.quarantines = true,
                // Capabilities are read from the store on every request: nothing is cached.
                Some(ChangeKind::Capability) | None => {}
            }
        }
        apply(engine, secrets, &step).await?;
        engine.config_cursor.store(last, Ordering::Release);
        out.changes += step.changes;
        out.subscriptions.extend(step.subscriptions);
        out.registrations.extend(step.registrations);
        out.bindings |= step.bindings;
        out.webhooks |= step.webhooks;
        out.quarantines |= step.quarantines;
        if !full {
            return Ok(out);
        }
    }
}

async fn apply(
    engine: &Engine,
    secrets: Option<&SecretStore>,
    step: &Applied,
) -> Result<(), TbError> {
    if let Some(secrets) = secrets {
        for id in &step.registrations {
            crate::registration::refresh_registration(engine, secrets, id).await?;
        }
    } else if !step.registrations.is_empty() {
        tracing::warn!(
            count = step.registrations.len(),
            "registrations changed on another replica, but this engine has no secret store: not loaded"
        );
    }
    for id in &step.subscriptions {
        match engine.store.get_subscription(id).await {
            Ok(rec) => engine.set_states([(rec.id, rec.state)]),
            Err(tb_store::StoreError::NotFound {
                kind: tb_store::RecordKind::Subscription,
            }) => {}
            Err(e) => return Err(store_err(e)),
        }
    }
    if step.bindings {
        engine.reload_revocations().await?;
    }
    if step.quarantines {
        engine.reload_quarantines().await?;
    }
    if step.webhooks {
        if let Some(secrets) = secrets {
            crate::webhooks::load(engine, secrets).await?;
        }
    }
    Ok(())
}

/// Re-reads every subscription's state (see [`STATE_RESYNC_MS`]). Errors: the store's.
pub async fn resync_states(engine: &Engine) -> Result<(), TbError> {
    let all = engine.store.list_subscriptions().await.map_err(store_err)?;
    engine.set_states(all.into_iter().map(|r| (r.id, r.state)));
    Ok(())
}

/// The sync task: [`poll_once`] every [`POLL_INTERVAL`], and at once when the store hints that a
/// change was committed ([`tb_store::Store::config_change_hints`]: PostgreSQL `LISTEN`), and
/// [`resync_states`] every [`STATE_RESYNC_MS`], until `stop` turns true (or its sender is dropped). A failed read is logged
/// and retried at the next tick. `secrets` is what registrations and webhooks are opened with (the
/// server's [`SecretStore`]); without it only states and revocations are refreshed. Spawn it once per
/// engine (`tokio::spawn(sync::run(...))`); on a single SQLite host it is cheap and harmless.
pub async fn run(
    engine: Arc<Engine>,
    secrets: Option<SecretStore>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_resync = std::time::Instant::now();
    let mut hints = engine.store.config_change_hints();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = async { hints.as_mut().expect("guarded").changed().await }, if hints.is_some() => {
                if r.is_err() {
                    // The listener is gone: polling alone from now on.
                    hints = None;
                }
            }
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
                continue;
            }
        }
        if *stop.borrow() {
            return;
        }
        if let Err(e) = poll_once(&engine, secrets.as_ref()).await {
            tracing::warn!(error = %e.message, "configuration sync: reading the change log failed; retrying");
        }
        if last_resync.elapsed() >= Duration::from_millis(STATE_RESYNC_MS) {
            last_resync = std::time::Instant::now();
            if let Err(e) = resync_states(&engine).await {
                tracing::warn!(error = %e.message, "configuration sync: re-reading states failed; retrying");
            }
        }
    }
}
