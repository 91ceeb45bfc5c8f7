//! The group-commit writer: ONE thread owns the write connection and batches every queued write into a
//! single `BEGIN IMMEDIATE ... COMMIT` (DESIGN §7). Each job runs in its own savepoint, so a job that fails
//! rolls back alone; callers are answered only after the batch's COMMIT returned (with
//! `synchronous=FULL`, after fsync).
//!
//! Failure rules (issue #9, defect 12):
//! - the queue is bounded ([`WriterOptions::queue_capacity`] jobs); a write that finds it full gets
//!   [`StoreError::Busy`] at once (the API answers 503 `unavailable` with `Retry-After: 1`);
//! - a job that panics is caught: its caller gets [`StoreError::Database`], its savepoint is rolled back,
//!   and the rest of the batch and the writer go on;
//! - a locked database (past the busy timeout) or a full disk fails the whole batch, and every caller gets
//!   a typed error ([`StoreError::Busy`] / [`StoreError::Unavailable`]) instead of waiting;
//! - if the thread dies anyway, [`Writer::is_alive`] turns false and every later write gets
//!   [`StoreError::Unavailable`].

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use rusqlite::Connection;

use super::classify;
use crate::sql::Db;
use tokio::sync::{mpsc, oneshot};

use crate::{StoreError, StoreResult};

/// Most jobs folded into one transaction.
pub const MAX_BATCH: usize = 512;

/// Default bound of the writer queue, in jobs (`[server].writer_queue_capacity`).
pub const DEFAULT_QUEUE_CAPACITY: usize = 10_000;

/// Largest accepted `queue_capacity`, in jobs (each queued job holds its request's data in memory).
pub const MAX_QUEUE_CAPACITY: usize = 1_000_000;

/// Settings of the writer thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterOptions {
    /// Jobs that may wait for the writer (1 to [`MAX_QUEUE_CAPACITY`]); a write beyond it is refused
    /// with [`StoreError::Busy`]. Default [`DEFAULT_QUEUE_CAPACITY`].
    pub queue_capacity: usize,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
        }
    }
}

trait Job: Send {
    /// Runs inside the batch's transaction, within a savepoint. An error rolls the savepoint back.
    fn run(&mut self, conn: &Connection) -> Result<(), StoreError>;
    /// Called after COMMIT (or its failure) with the batch's fate.
    fn finish(self: Box<Self>, committed: Result<(), StoreError>);
}

struct TypedJob<T, F> {
    f: F,
    out: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for TypedJob<T, F>
where
    T: Send + 'static,
    F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
{
    fn run(&mut self, conn: &Connection) -> Result<(), StoreError> {
        // A panicking job must not take the writer (and with it the whole store) down: its caller gets
        // an error and its savepoint is rolled back.
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| (self.f)(conn))).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            tracing::error!(panic = %what, "write job panicked; rolled back");
            metrics::counter!("tb_writer_job_panics_total").increment(1);
            Err(StoreError::Database(format!(
                "write job panicked and was rolled back: {what}"
            )))
        });
        let status = r.as_ref().map(|_| ()).map_err(StoreError::clone);
        self.out = Some(r);
        status
    }

    fn finish(self: Box<Self>, committed: Result<(), StoreError>) {
        let r = match (committed, self.out) {
            (Ok(()), Some(out)) => out,
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(StoreError::Database("job did not run".into())),
        };
        let _ = self.reply.send(r);
    }
}

/// Test hook: a job whose `finish` panics, outside the per-job guard, so the writer thread dies.
struct CrashJob;

impl Job for CrashJob {
    fn run(&mut self, _conn: &Connection) -> Result<(), StoreError> {
        Ok(())
    }
    fn finish(self: Box<Self>, _committed: Result<(), StoreError>) {
        panic!("writer crash requested by a test");
    }
}

/// Handle to the writer thread.
pub struct Writer {
    tx: std::sync::Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    alive: Arc<AtomicBool>,
}

/// Clears the writer's `alive` flag when the thread ends, however it ends (return or panic).
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            tracing::error!("the store's writer thread died; the store is unavailable");
        }
    }
}

impl Writer {
    /// Starts the writer thread on `conn` with a queue of `opts.queue_capacity` jobs (at least 1).
    pub fn start(conn: Connection, opts: WriterOptions) -> Writer {
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>(opts.queue_capacity.max(1));
        let alive = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(alive.clone());
        let thread = std::thread::Builder::new()
            .name("tb-sqlite-writer".into())
            .spawn(move || {
                let _guard = guard;
                run_loop(conn, rx)
            })
            .expect("spawn writer thread");
        Writer {
            tx: std::sync::Mutex::new(Some(tx)),
            thread: std::sync::Mutex::new(Some(thread)),
            alive,
        }
    }

    /// Whether the writer thread is still running (false once it died or was closed).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn enqueue(&self, job: Box<dyn Job>) -> StoreResult<()> {
        let guard = self.tx.lock().expect("writer lock");
        let Some(tx) = guard.as_ref() else {
            return Err(StoreError::Unavailable("store is closed".into()));
        };
        tx.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => {
                metrics::counter!("tb_writer_busy_total").increment(1);
                StoreError::Busy(format!(
                    "the write queue is full ({} jobs); retry shortly",
                    tx.max_capacity()
                ))
            }
            mpsc::error::TrySendError::Closed(_) => {
                StoreError::Unavailable("writer stopped".into())
            }
        })
    }

    /// Queues `f` into the next group commit and waits for the commit. Errors: `Busy` (queue full),
    /// `Unavailable` (closed, writer gone, disk full), `Database` (the job failed or panicked), or the
    /// job's own error.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        self.enqueue(Box::new(TypedJob {
            f,
            out: None,
            reply,
        }))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("writer stopped".into()))?
    }

    /// Test hook: makes the writer thread panic outside the per-job guard (it dies; the store turns
    /// unavailable). Not for production use.
    #[doc(hidden)]
    pub fn crash_for_test(&self) -> StoreResult<()> {
        self.enqueue(Box::new(CrashJob))
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

fn run_loop(conn: Connection, mut rx: mpsc::Receiver<Box<dyn Job>>) {
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
        if result.is_ok() {
            // One group commit holds the whole batch (the bench reports transactions per event).
            metrics::counter!("tb_store_transactions_total", "backend" => "sqlite").increment(1);
            metrics::counter!("tb_store_write_jobs_total", "backend" => "sqlite")
                .increment(batch.len() as u64);
        }
        if let Err(e) = &result {
            metrics::counter!("tb_writer_batch_failures_total").increment(1);
            tracing::error!(error = %e, jobs = batch.len(), "group commit failed");
        }
        for job in batch.drain(..) {
            job.finish(result.clone());
        }
    }
}

/// The error each caller of a failed batch gets: typed by the SQLite failure (see [`classify`]).
fn batch_error(e: rusqlite::Error) -> StoreError {
    match classify(&e) {
        StoreError::Database(m) => StoreError::Database(format!("commit failed: {m}")),
        other => other,
    }
}

fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql).and_then(|mut s| s.execute([]))?;
    Ok(())
}

/// Runs one batch in one transaction. Errors (typed, for every caller of the batch): the transaction could
/// not begin or commit, or a job's failure took the whole transaction down (SQLite rolls a transaction
/// back by itself on e.g. `SQLITE_FULL`; then that job's error is the batch's).
fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
    exec_cached(conn, "BEGIN IMMEDIATE").map_err(batch_error)?;
    for job in batch.iter_mut() {
        // Prepared once and cached: a savepoint costs two cheap statement steps, no parsing.
        exec_cached(conn, "SAVEPOINT job").map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            batch_error(e)
        })?;
        let step = match job.run(conn) {
            Ok(()) => exec_cached(conn, "RELEASE job").map_err(batch_error),
            Err(job_err) => exec_cached(conn, "ROLLBACK TO job")
                .and_then(|_| exec_cached(conn, "RELEASE job"))
                .map_err(|e| {
                    if conn.is_autocommit() {
                        // The job's failure already rolled the whole transaction back.
                        job_err
                    } else {
                        batch_error(e)
                    }
                }),
        };
        if let Err(e) = step {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            return Err(e);
        }
    }
    exec_cached(conn, "COMMIT").map_err(|e| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        batch_error(e)
    })
}
