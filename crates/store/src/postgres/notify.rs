//! The sending side of the cross-replica wake-ups (DESIGN §9 change stream; the receiving
//! side is [`super::listen`]). After a commit, [`crate::sql::SqlStore`] announces what kind of change
//! it was ([`Wake`]); this module turns announcements into `NOTIFY`s:
//!
//! - never inside the ingest or attempt transaction: `NOTIFY` takes a database-wide lock at COMMIT, so
//!   one per row would serialize every commit;
//! - debounced per channel: one thread with its own connection sends at most one notification per
//!   channel per [`DEBOUNCE`], however many commits announced it (at most 2 x 1000/DEBOUNCE short
//!   autocommit statements a second per replica, and none while idle);
//! - the payload is `"<schema> <sender>"` so listeners on another schema ignore it and the sender's own
//!   listener skips it.
//!
//! A lost notification (the connection broke) costs latency only: every sleeper also polls.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::Duration;

use super::config::connect;
use crate::Wake;

/// Shortest time between two notifications of one channel from one replica: the most a wake-up waits
/// to be sent (ms).
pub const DEBOUNCE: Duration = Duration::from_millis(20);

/// How long the idle thread sleeps before checking whether its store was dropped.
const CHECK_EVERY: Duration = Duration::from_millis(500);

fn bit(w: Wake) -> u8 {
    match w {
        Wake::Work => 1,
        Wake::Sessions => 2,
    }
}

struct Shared {
    /// Channels announced since the last send ([`bit`]s).
    pending: AtomicU8,
    closed: AtomicBool,
    thread: Mutex<Option<Thread>>,
}

/// Announcements of one store, sent by one thread started on the first announcement.
pub struct Notifier {
    cfg: tokio_postgres::Config,
    sender: String,
    shared: Arc<Shared>,
}

impl Notifier {
    /// A notifier for the store on `cfg` whose listener skips `sender`. Starts nothing yet.
    pub fn new(cfg: tokio_postgres::Config, sender: String) -> Notifier {
        Notifier {
            cfg,
            sender,
            shared: Arc::new(Shared {
                pending: AtomicU8::new(0),
                closed: AtomicBool::new(false),
                thread: Mutex::new(None),
            }),
        }
    }

    /// Marks `wake` to be sent by the next send (no I/O; a few atomic operations). Starts the sending
    /// thread on first use; if it cannot be started the announcement is dropped with a warning (the
    /// other replicas still poll).
    pub fn announce(&self, wake: Wake) {
        let before = self.shared.pending.fetch_or(bit(wake), Ordering::AcqRel);
        if before & bit(wake) != 0 {
            return; // Already pending: the thread will send it.
        }
        self.start();
    }

    /// Starts the sending thread (which connects at once) if it is not running, else wakes it. A
    /// server calls this early so that its first wake-up does not wait for a connection.
    pub fn start(&self) {
        let mut t = self.shared.thread.lock().unwrap_or_else(|p| p.into_inner());
        match &*t {
            Some(thread) => thread.unpark(),
            None => {
                let (cfg, sender, shared) =
                    (self.cfg.clone(), self.sender.clone(), self.shared.clone());
                match std::thread::Builder::new()
                    .name("tb-pg-notify".into())
                    .spawn(move || run(cfg, sender, shared))
                {
                    Ok(h) => *t = Some(h.thread().clone()),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start the PostgreSQL notifier thread: other replicas see changes by polling only")
                    }
                }
            }
        }
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        if let Some(t) = &*self.shared.thread.lock().unwrap_or_else(|p| p.into_inner()) {
            t.unpark();
        }
    }
}

fn run(cfg: tokio_postgres::Config, sender: String, shared: Arc<Shared>) {
    let mut conn: Option<(postgres::Client, String)> = None;
    // Connect now (a failure is retried at the first send).
    let _ = send(&cfg, &mut conn, &sender, 0);
    while !shared.closed.load(Ordering::Acquire) {
        let due = shared.pending.swap(0, Ordering::AcqRel);
        if due == 0 {
            std::thread::park_timeout(CHECK_EVERY);
            continue;
        }
        if let Err(e) = send(&cfg, &mut conn, &sender, due) {
            tracing::warn!(error = %e, "sending a wake-up to the other replicas failed; they poll instead");
            conn = None;
        }
        // Whatever is announced meanwhile goes out together in the next send.
        std::thread::sleep(DEBOUNCE);
    }
}

/// Sends one notification per channel in `due`, connecting first when needed.
fn send(
    cfg: &tokio_postgres::Config,
    conn: &mut Option<(postgres::Client, String)>,
    sender: &str,
    due: u8,
) -> Result<(), String> {
    if conn.is_none() {
        let mut c = connect(cfg).map_err(|e| e.to_string())?;
        let schema: String = c
            .query_one("SELECT current_schema()::TEXT", &[])
            .map_err(|e| e.to_string())?
            .get(0);
        *conn = Some((c, schema));
    }
    let (client, schema) = conn.as_mut().expect("connected above");
    let payload = format!("{schema} {sender}");
    for w in Wake::ALL {
        if due & bit(w) != 0 {
            client
                .execute("SELECT pg_notify($1, $2)", &[&w.channel(), &payload])
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}
