//! Wake-ups from other replicas (DESIGN §9 change stream): turns the store's cross-replica
//! hints ([`tb_store::Store::wake_hints`]; PostgreSQL `LISTEN`) into this engine's in-process wake-ups,
//! so an idle delivery worker leases a delivery another replica committed, and a long-poll (a wait, a
//! turn claim) or the timer loop reads again after a session change made through another replica,
//! within milliseconds instead of at the next poll (the worker's 1 s `idle_poll`; a long-poll's whole
//! timeout).
//!
//! - [`Wake::Work`] -> [`Engine::work_ready`] (one worker permit: the worker leases a batch);
//! - [`Wake::Sessions`] -> [`Engine::sessions`] (every long-poll and the timer loop re-read their run),
//!   and [`Engine::run_events_committed`]: a session change on another replica (an API replica has no
//!   worker) appended run events whose outbound webhook deliveries this replica's worker may take.
//!
//! The hints carry no ids: a woken sleeper re-reads its own record, so a hint is never trusted for a
//! decision. A hint may be lost (listener reconnecting); every sleeper still polls. With a backend that
//! has no hints (SQLite: one process) the task ends at once.

use std::sync::Arc;

use tb_store::Wake;
use tokio::sync::watch;

use crate::Engine;

/// Runs until `stop` turns true (or its sender is dropped), or both hint channels closed.
pub async fn run(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut work = engine.store.wake_hints(Wake::Work);
    let mut sessions = engine.store.wake_hints(Wake::Sessions);
    while work.is_some() || sessions.is_some() {
        tokio::select! {
            r = async { work.as_mut().expect("guarded").changed().await }, if work.is_some() => {
                match r {
                    Ok(()) => engine.work_ready.notify_one(),
                    Err(_) => work = None,
                }
            }
            r = async { sessions.as_mut().expect("guarded").changed().await }, if sessions.is_some() => {
                match r {
                    // Not `session_changed`: that is for this replica's own commits.
                    Ok(()) => {
                        engine.sessions.send_modify(|n| *n = n.wrapping_add(1));
                        engine.run_events_committed();
                    }
                    Err(_) => sessions = None,
                }
            }
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}
