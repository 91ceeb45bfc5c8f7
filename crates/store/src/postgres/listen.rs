//! Prompt hints on PostgreSQL (DESIGN §9 change stream). One listener thread per store keeps
//! one extra connection in `LISTEN` on three channels and bumps one counter per channel:
//!
//! - [`CHANNEL`] (configuration): every configuration change transaction runs
//!   `pg_notify('trigger_bridge_config', current_schema())` (see `sql/config.rs`; sent at COMMIT, only by
//!   those transactions), so the engine's sync task reads the change log at once instead of at its next
//!   250 ms tick;
//! - [`Wake::Work`] and [`Wake::Sessions`]: sent by [`super::notify`] after a replica committed due
//!   deliveries or a session change, at most once per channel per debounce interval and never inside the
//!   ingest or attempt transaction (a `NOTIFY` takes a database-wide lock at commit). Their payload is
//!   `"<schema> <sender>"`; a replica skips its own (it woke its sleepers in-process).
//!
//! A hint, never the record: a notification sent while the listener reconnects is lost, so the
//! listener bumps every counter once after each (re)connect and the sleepers keep polling.

use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;
use tokio::sync::watch;

use super::config::connect;
use crate::Wake;

/// The channel configuration changes notify; the payload is the schema the change was made in.
pub const CHANNEL: &str = "trigger_bridge_config";

/// How long the listener waits for a notification before checking whether anyone still listens.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Pause before reconnecting after the listener's connection failed.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// The receiving ends of one listener: a counter per channel, each changing (by one or more) after
/// each notification of that channel from the connection's schema (and, for the wake-up channels,
/// from another sender), and after each (re)connect.
#[derive(Clone)]
pub struct Hints {
    /// Configuration changes.
    pub config: watch::Receiver<u64>,
    /// [`Wake::Work`] from other replicas.
    pub work: watch::Receiver<u64>,
    /// [`Wake::Sessions`] from other replicas.
    pub sessions: watch::Receiver<u64>,
}

impl Hints {
    /// The counter of wake-up channel `wake`.
    pub fn wake(&self, wake: Wake) -> watch::Receiver<u64> {
        match wake {
            Wake::Work => self.work.clone(),
            Wake::Sessions => self.sessions.clone(),
        }
    }
}

struct Senders {
    config: watch::Sender<u64>,
    work: watch::Sender<u64>,
    sessions: watch::Sender<u64>,
}

impl Senders {
    fn all(&self) -> [&watch::Sender<u64>; 3] {
        [&self.config, &self.work, &self.sessions]
    }
    fn closed(&self) -> bool {
        self.all().iter().all(|s| s.is_closed())
    }
}

fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}

/// Starts the listener thread on `cfg` and returns its counters. `sender` is this store's own sender
/// id (see [`super::notify`]): wake-ups it sent are not counted. The thread ends soon after every
/// receiver was dropped. Errors: none at start (a connection failure is retried every second and
/// logged).
pub fn spawn(cfg: tokio_postgres::Config, sender: String) -> Hints {
    let (config, config_rx) = watch::channel(0u64);
    let (work, work_rx) = watch::channel(0u64);
    let (sessions, sessions_rx) = watch::channel(0u64);
    let tx = Senders {
        config,
        work,
        sessions,
    };
    let spawned = std::thread::Builder::new()
        .name("tb-pg-listen".into())
        .spawn(move || run(cfg, sender, tx));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the PostgreSQL listener thread: changes of other replicas are seen by polling only");
    }
    Hints {
        config: config_rx,
        work: work_rx,
        sessions: sessions_rx,
    }
}

fn run(cfg: tokio_postgres::Config, sender: String, tx: Senders) {
    while !tx.closed() {
        match listen(&cfg, &sender, &tx) {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, "PostgreSQL listener lost its connection; reconnecting");
                std::thread::sleep(RECONNECT_AFTER);
            }
        }
    }
}

/// One connection's life: LISTEN, then bump on each notification of this schema. `Ok` when nobody
/// listens any more; `Err` when the connection failed.
fn listen(cfg: &tokio_postgres::Config, sender: &str, tx: &Senders) -> Result<(), String> {
    let mut client = connect(cfg).map_err(|e| e.to_string())?;
    let schema: String = client
        .query_one("SELECT current_schema()::TEXT", &[])
        .map_err(|e| e.to_string())?
        .get(0);
    client
        .batch_execute(&format!(
            "LISTEN {CHANNEL}; LISTEN {}; LISTEN {}",
            Wake::Work.channel(),
            Wake::Sessions.channel()
        ))
        .map_err(|e| e.to_string())?;
    // Anything committed while we were not listening is found by the polls this wakes.
    for t in tx.all() {
        bump(t);
    }
    loop {
        if tx.closed() {
            return Ok(());
        }
        let next = client.notifications().timeout_iter(CHECK_EVERY).next();
        match next {
            Ok(Some(n)) => {
                if let Some(t) = route(tx, &schema, sender, n.channel(), n.payload()) {
                    bump(t);
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

/// The counter a notification on `channel` with `payload` bumps: one of this schema, and for the
/// wake-up channels one not sent by `sender` itself.
fn route<'t>(
    tx: &'t Senders,
    schema: &str,
    sender: &str,
    channel: &str,
    payload: &str,
) -> Option<&'t watch::Sender<u64>> {
    if channel == CHANNEL {
        return (payload == schema).then_some(&tx.config);
    }
    let (from_schema, from) = payload.split_once(' ')?;
    if from_schema != schema || from == sender {
        return None;
    }
    if channel == Wake::Work.channel() {
        Some(&tx.work)
    } else if channel == Wake::Sessions.channel() {
        Some(&tx.sessions)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_route_by_channel_schema_and_sender() {
        let (config, _a) = watch::channel(0u64);
        let (work, _b) = watch::channel(0u64);
        let (sessions, _c) = watch::channel(0u64);
        let tx = Senders {
            config,
            work,
            sessions,
        };
        let is = |r: Option<&watch::Sender<u64>>, t: &watch::Sender<u64>| {
            r.is_some_and(|r| std::ptr::eq(r, t))
        };
        assert!(is(route(&tx, "s1", "me", CHANNEL, "s1"), &tx.config));
        assert!(route(&tx, "s1", "me", CHANNEL, "s2").is_none());
        let work = Wake::Work.channel();
        let sessions = Wake::Sessions.channel();
        assert!(is(route(&tx, "s1", "me", work, "s1 other"), &tx.work));
        assert!(is(
            route(&tx, "s1", "me", sessions, "s1 other"),
            &tx.sessions
        ));
        assert!(
            route(&tx, "s1", "me", work, "s1 me").is_none(),
            "own wake-up skipped"
        );
        assert!(
            route(&tx, "s1", "me", work, "s2 other").is_none(),
            "other schema"
        );
        assert!(route(&tx, "s1", "me", work, "garbage").is_none());
        assert!(route(&tx, "s1", "me", "unknown", "s1 other").is_none());
    }
}
