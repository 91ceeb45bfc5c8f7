//! Prompt configuration hints on PostgreSQL (issue #10, DESIGN §9): every configuration change
//! transaction runs `pg_notify('trigger_bridge_config', current_schema())` (see `sql/config.rs`; the
//! notification is sent at COMMIT, and only by those transactions, never by ingest or attempts). One
//! listener thread per store keeps one extra connection in `LISTEN trigger_bridge_config` and bumps a
//! counter for each notification from its own schema, so the engine's sync task reads the change log
//! at once instead of at its next 250 ms tick.
//!
//! A hint, never the record: a notification sent while the listener reconnects is lost, so the
//! listener bumps the counter once after each (re)connect and the sync task keeps polling.

use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use tokio::sync::watch;

use super::config::connect;

/// The channel configuration changes notify; the payload is the schema the change was made in.
pub const CHANNEL: &str = "trigger_bridge_config";

/// How long the listener waits for a notification before checking whether anyone still listens.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Pause before reconnecting after the listener's connection failed.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Starts the listener thread on `cfg` and returns the hint counter: it changes (by one or more) after
/// each notification from the connection's schema and after each (re)connect. The thread ends soon
/// after every receiver was dropped. Errors: none at start (a connection failure is retried every
/// second and logged).
pub fn spawn(cfg: tokio_postgres::Config) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let spawned = std::thread::Builder::new()
        .name("tb-pg-listen".into())
        .spawn(move || run(cfg, tx));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the PostgreSQL listener thread: configuration changes are seen by polling only");
    }
    rx
}

fn run(cfg: tokio_postgres::Config, tx: watch::Sender<u64>) {
    while !tx.is_closed() {
        match listen(&cfg, &tx) {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "PostgreSQL config listener lost its connection; reconnecting");
                std::thread::sleep(RECONNECT_AFTER);
            }
        }
    }
}

/// One connection's life: LISTEN, then wake on each notification of this schema. `Ok` when nobody
/// listens any more; `Err` when the connection failed.
fn listen(cfg: &tokio_postgres::Config, tx: &watch::Sender<u64>) -> Result<(), String> {
    let mut client = connect(cfg).map_err(|e| e.to_string())?;
    let schema: String = client
        .query_one("SELECT current_schema()::TEXT", &[])
        .map_err(|e| e.to_string())?
        .get(0);
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .map_err(|e| e.to_string())?;
    // Anything committed while we were not listening is found by the poll this wakes.
    tx.send_modify(|n| *n = n.wrapping_add(1));
    loop {
        if tx.is_closed() {
            return Ok(());
        }
        let next = client.notifications().timeout_iter(CHECK_EVERY).next();
        match next {
            Ok(Some(n)) => {
                if n.payload() == schema {
                    tx.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            Ok(None) => {
                if client.is_closed() {
                    return Err("connection closed".into());
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}
