//! The group-commit writer: ONE thread owns the write connection and batches every queued write into a
//! single `BEGIN IMMEDIATE ... COMMIT` (DESIGN §7). Each job runs in its own savepoint, so a job that fails
//! rolls back alone; callers are answered only after the batch's COMMIT returned (with
//! `synchronous=FULL`, after fsync).

use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::{StoreError, StoreResult};

/// Most jobs folded into one transaction.
pub const MAX_BATCH: usize = 512;

trait Job: Send {
    /// Runs inside the batch's transaction, within a savepoint.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Called after COMMIT (or its failure) with the batch's fate.
    fn finish(self: Box<Self>, committed: Result<(), String>);
}

struct TypedJob<T, F> {
    f: Option<F>,
    out: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for TypedJob<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let f = self.f.take().expect("job runs once");
        let r = f(conn);
        let ok = r.is_ok();
        self.out = Some(r);
        ok
    }

    fn finish(self: Box<Self>, committed: Result<(), String>) {
        let r = match (committed, self.out) {
            (Ok(()), Some(out)) => out,
            (Err(e), _) => Err(StoreError::Database(format!("commit failed: {e}"))),
            (Ok(()), None) => Err(StoreError::Database("job did not run".into())),
        };
        let _ = self.reply.send(r);
    }
}

/// Handle to the writer thread.
pub struct Writer {
    tx: std::sync::Mutex<Option<mpsc::UnboundedSender<Box<dyn Job>>>>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Writer {
    /// Starts the writer thread on `conn`.
    pub fn start(conn: Connection) -> Writer {
        let (tx, rx) = mpsc::unbounded_channel::<Box<dyn Job>>();
        let thread = std::thread::Builder::new()
            .name("tb-sqlite-writer".into())
            .spawn(move || run_loop(conn, rx))
            .expect("spawn writer thread");
        Writer {
            tx: std::sync::Mutex::new(Some(tx)),
            thread: std::sync::Mutex::new(Some(thread)),
        }
    }

    /// Queues `f` into the next group commit and waits for the commit.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(TypedJob {
            f: Some(f),
            out: None,
            reply,
        });
        {
            let guard = self.tx.lock().expect("writer lock");
            let Some(tx) = guard.as_ref() else {
                return Err(StoreError::Unavailable("store is closed".into()));
            };
            tx.send(job)
                .map_err(|_| StoreError::Unavailable("writer stopped".into()))?;
        }
        rx.await
            .map_err(|_| StoreError::Unavailable("writer stopped".into()))?
    }

    /// Stops accepting jobs, lets the thread commit what is queued, and joins it.
    pub async fn close(&self) {
        self.tx.lock().expect("writer lock").take();
        let handle = self.thread.lock().expect("writer lock").take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }
}

fn run_loop(conn: Connection, mut rx: mpsc::UnboundedReceiver<Box<dyn Job>>) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let result = run_batch(&conn, &mut batch);
        if let Err(e) = &result {
            tracing::error!(error = %e, jobs = batch.len(), "group commit failed");
        }
        for job in batch.drain(..) {
            job.finish(result.clone());
        }
    }
}

fn exec_cached(conn: &Connection, sql: &str) -> Result<(), String> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<(), String> {
    exec_cached(conn, "BEGIN IMMEDIATE")?;
    for job in batch.iter_mut() {
        // Prepared once and cached: a savepoint costs two cheap statement steps, no parsing.
        let step = exec_cached(conn, "SAVEPOINT job").and_then(|_| {
            if job.run(conn) {
                exec_cached(conn, "RELEASE job")
            } else {
                exec_cached(conn, "ROLLBACK TO job").and_then(|_| exec_cached(conn, "RELEASE job"))
            }
        });
        if let Err(e) = step {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
    }
    exec_cached(conn, "COMMIT").inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}
