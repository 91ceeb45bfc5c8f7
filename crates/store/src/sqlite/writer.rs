//! The group-commit writer: ONE thread owns the write connection and batches every queued write into a
//! single `BEGIN IMMEDIATE ... COMMIT` (docs/architecture.md, "SQLite: the group commit"). Each job runs
//! in its own savepoint, so a job that fails rolls back alone. Callers are answered only after their
//! batch is on disk: the `COMMIT` itself does not wait for the disk (`synchronous = NORMAL`); a second
//! thread, `tb-sqlite-sync`, flushes the WAL (`fdatasync`) once for every batch committed since its last
//! flush and then answers them, while the writer already builds the next batch (`super::durable`).
//!
//! Failure rules:
//! - the queue is bounded ([`WriterOptions::queue_capacity`] jobs); a write that finds it full gets
//!   [`StoreError::Busy`] at once (the API answers 503 `unavailable` with `Retry-After: 1`);
//! - a job that panics is caught: its caller gets [`StoreError::Database`], its savepoint is rolled back,
//!   and the rest of the batch and the writer go on;
//! - a locked database (past the busy timeout) or a full disk fails the whole batch, and every caller gets
//!   a typed error ([`StoreError::Busy`] / [`StoreError::Unavailable`]) instead of waiting;
//! - if the thread dies anyway, [`Writer::is_alive`] turns false and every later write gets
//!   [`StoreError::Unavailable`];
//! - a failed flush of the WAL stops the store (as PostgreSQL does on a failed fsync): the batches it
//!   covered get [`StoreError::Unavailable`]; every later write is refused before it runs (nothing of
//!   it is committed), and every later read fails too, since it may have seen a batch never flushed.
//!   A dead sync thread stops the store the same way.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use rusqlite::Connection;

use super::classify;
use super::durable::Durability;
use crate::after_commit;
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
    /// What the run recorded for metrics, emitted by [`Job::finish`] (`crate::after_commit`).
    facts: Vec<after_commit::Fact>,
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
        after_commit::start();
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
        self.facts = after_commit::take();
        let status = r.as_ref().map(|_| ()).map_err(StoreError::clone);
        self.out = Some(r);
        status
    }

    fn finish(self: Box<Self>, committed: Result<(), StoreError>) {
        let (r, fate) = match (committed, self.out) {
            (Ok(()), Some(Ok(v))) => (Ok(v), after_commit::Fate::Committed),
            (Ok(()), Some(Err(e))) => (Err(e), after_commit::Fate::Refused),
            (Err(e), _) => (Err(e), after_commit::Fate::Lost),
            (Ok(()), None) => (
                Err(StoreError::Database("job did not run".into())),
                after_commit::Fate::Lost,
            ),
        };
        after_commit::emit(self.facts, fate);
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
    durability: Arc<Durability>,
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
    /// Starts the writer thread on `conn` with a queue of `opts.queue_capacity` jobs (at least 1), and
    /// the sync thread that flushes the database's `-wal` file after each group commit, before the
    /// batch's callers are answered (`super::durable`). Sets `synchronous = NORMAL` on `conn` (its
    /// `COMMIT` no longer waits for the disk: the sync thread does). Panics if `conn` is an in-memory
    /// database (it has no WAL file) or the pragma fails.
    pub fn start(conn: Connection, opts: WriterOptions) -> Writer {
        conn.execute_batch("PRAGMA synchronous = NORMAL;")
            .expect("set synchronous = NORMAL on the writer connection");
        let db = conn.path().expect("a file database").to_string();
        let wal = PathBuf::from(format!("{db}-wal"));
        Self::start_with(conn, opts, wal_sync(wal))
    }

    /// [`Self::start`] with the flush given (`conn` as it is): tests hold it to see who waits for
    /// the disk.
    pub(crate) fn start_with(
        conn: Connection,
        opts: WriterOptions,
        sync: Box<dyn FnMut() -> std::io::Result<()> + Send>,
    ) -> Writer {
        let durability = Arc::new(Durability::new());
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>(opts.queue_capacity.max(1));
        let alive = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(alive.clone());
        let sync_alive = alive.clone();
        let sync_durability = durability.clone();
        let writer_durability = durability.clone();
        let thread = std::thread::Builder::new()
            .name("tb-sqlite-writer".into())
            .spawn(move || {
                let _guard = guard;
                // Batches committed but not yet flushed; a full queue holds the writer back.
                let (done_tx, done_rx) = std_mpsc::sync_channel::<Committed>(SYNC_QUEUE);
                let d = sync_durability;
                let syncer = std::thread::Builder::new()
                    .name("tb-sqlite-sync".into())
                    .spawn(move || sync_loop(done_rx, sync, d, sync_alive))
                    .expect("spawn sync thread");
                run_loop(&conn, rx, &writer_durability, &done_tx);
                drop(done_tx);
                let _ = syncer.join();
                // Closed only after the last flush: the last connection to close may checkpoint and
                // delete the WAL file the sync thread flushes.
                drop(conn);
            })
            .expect("spawn writer thread");
        Writer {
            tx: std::sync::Mutex::new(Some(tx)),
            thread: std::sync::Mutex::new(Some(thread)),
            alive,
            durability,
        }
    }

    /// What is durable: the readers of this writer's database wait on it ([`Durability::settled`]).
    pub(crate) fn durability(&self) -> Arc<Durability> {
        self.durability.clone()
    }

    /// Whether the writer thread is still running (false once it died or was closed).
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn enqueue(&self, job: Box<dyn Job>) -> StoreResult<()> {
        // A stopped store writes nothing more (a failed flush, the sync thread gone).
        self.durability.check()?;
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
            facts: Vec::new(),
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

/// Batches the writer may commit ahead of the disk before it waits for the sync thread.
const SYNC_QUEUE: usize = 64;

/// A committed (or failed) batch on its way to the sync thread: its jobs are answered after the flush.
struct Committed {
    seq: u64,
    jobs: Vec<Box<dyn Job>>,
    result: Result<(), StoreError>,
}

fn run_loop(
    conn: &Connection,
    mut rx: mpsc::Receiver<Box<dyn Job>>,
    durability: &Durability,
    done: &std_mpsc::SyncSender<Committed>,
) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        if let Err(e) = durability.check() {
            // Stopped after these were queued: refused without running, nothing of them committed.
            for job in batch.drain(..) {
                job.finish(Err(e.clone()));
            }
            continue;
        }
        let (seq, result) = run_batch(conn, &mut batch, durability);
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
        let jobs = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
        let committed = Committed { seq, jobs, result };
        if let Err(std_mpsc::SendError(c)) = done.send(committed) {
            // The sync thread is gone: nothing can be made durable any more.
            for job in c.jobs {
                job.finish(Err(StoreError::Unavailable(
                    "the sync thread stopped".into(),
                )));
            }
            return;
        }
    }
}

/// The flush of the WAL file at `path`: `fdatasync` on it, opened at the first flush (SQLite creates
/// the file with the first write in WAL mode, and keeps it while a connection is open).
fn wal_sync(path: PathBuf) -> Box<dyn FnMut() -> std::io::Result<()> + Send> {
    let mut file: Option<std::fs::File> = None;
    Box::new(move || {
        if file.is_none() {
            file = Some(std::fs::File::open(&path)?);
        }
        file.as_ref().expect("opened above").sync_data()
    })
}

/// Clears the sync thread's share of the store when it ends, however it ends: readers stop waiting
/// for it, and the writer is no longer alive.
struct SyncGuard {
    durability: Arc<Durability>,
    alive: Arc<AtomicBool>,
}

impl Drop for SyncGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.alive.store(false, Ordering::SeqCst);
            self.durability.stop("the store's sync thread died");
            tracing::error!("the store's sync thread died; the store is unavailable");
        }
        self.durability.synced_up_to(u64::MAX);
    }
}

/// The sync thread: takes every batch committed since its last flush, flushes the WAL once for all
/// of them (none when all failed), marks them durable, then answers their callers in commit order. A
/// failed flush is the end of the store, as in PostgreSQL (a page the kernel could not write may be
/// dropped from its cache, and a retry would report success): the callers get `Unavailable`, and so
/// does every later write.
fn sync_loop(
    rx: std_mpsc::Receiver<Committed>,
    mut sync: Box<dyn FnMut() -> std::io::Result<()> + Send>,
    durability: Arc<Durability>,
    alive: Arc<AtomicBool>,
) {
    let _guard = SyncGuard {
        durability: durability.clone(),
        alive: alive.clone(),
    };
    let mut broken: Option<String> = None;
    let mut group: Vec<Committed> = Vec::new();
    while let Ok(first) = rx.recv() {
        group.push(first);
        while let Ok(more) = rx.try_recv() {
            group.push(more);
        }
        if broken.is_none() && group.iter().any(|c| c.result.is_ok()) {
            if let Err(e) = sync() {
                tracing::error!(error = %e, "fdatasync of the SQLite WAL failed; the store stops");
                metrics::counter!("tb_writer_batch_failures_total").increment(1);
                alive.store(false, Ordering::SeqCst);
                let why = format!("the WAL could not be flushed to disk: {e}");
                durability.stop(&why);
                broken = Some(why);
            }
        }
        let last = group.last().map(|c| c.seq).unwrap_or(0);
        durability.synced_up_to(last);
        for c in group.drain(..) {
            let result = match (&broken, c.result) {
                (Some(why), Ok(())) => Err(StoreError::Unavailable(why.clone())),
                (_, r) => r,
            };
            for job in c.jobs {
                job.finish(result.clone());
            }
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
fn run_batch(
    conn: &Connection,
    batch: &mut [Box<dyn Job>],
    durability: &Durability,
) -> (u64, Result<(), StoreError>) {
    // Numbered just before its COMMIT, so a reader that sees it waits for its flush
    // (`Durability::settled`); a batch that fails before it takes the last number again (harmless).
    let mut seq = durability.committed();
    let r = run_jobs(conn, batch, || seq = durability.begin_commit());
    (seq, r)
}

fn run_jobs(
    conn: &Connection,
    batch: &mut [Box<dyn Job>],
    mut before_commit: impl FnMut(),
) -> Result<(), StoreError> {
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
    before_commit();
    exec_cached(conn, "COMMIT").map_err(|e| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        batch_error(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    /// A flush that blocks until the test lets it through, and counts itself.
    struct Gate {
        calls: Arc<AtomicUsize>,
        open: std_mpsc::Sender<std::io::Result<()>>,
    }

    fn gated(dir: &std::path::Path) -> (Writer, Gate, PathBuf) {
        let path = dir.join("t.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; CREATE TABLE t (k INTEGER PRIMARY KEY)",
        )
        .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let (open, wait) = std_mpsc::channel::<std::io::Result<()>>();
        let counted = calls.clone();
        let sync = Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            wait.recv().unwrap_or(Ok(()))
        });
        let w = Writer::start_with(conn, WriterOptions::default(), sync);
        (w, Gate { calls, open }, path)
    }

    fn insert(w: &Arc<Writer>, k: i64) -> tokio::task::JoinHandle<StoreResult<()>> {
        let w = w.clone();
        tokio::spawn(async move {
            w.write(move |c| {
                c.exec("INSERT INTO t (k) VALUES (?1)", crate::p![k])
                    .map(|_| ())
            })
            .await
        })
    }

    fn visible(path: &std::path::Path, n: i64) -> bool {
        let r = Connection::open(path).unwrap();
        r.query_row("SELECT COUNT(*) FROM t", [], |row| row.get::<_, i64>(0))
            .unwrap()
            >= n
    }

    /// Bounded wait for `cond` (5 s).
    async fn until(mut cond: impl FnMut() -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_is_answered_only_after_its_batch_is_flushed_and_flushes_are_shared() {
        let dir = tempfile::tempdir().unwrap();
        let (w, gate, path) = gated(dir.path());
        let w = Arc::new(w);
        let d = w.durability();
        let first = insert(&w, 1);
        // The row is committed (a reader sees it) and its flush has begun, but nobody is answered.
        until(|| visible(&path, 1), "the first commit").await;
        until(|| gate.calls.load(Ordering::SeqCst) == 1, "the first flush").await;
        assert!(!first.is_finished(), "answered before the flush");
        assert!(
            !d.is_settled(),
            "a committed batch counts as durable before its flush"
        );
        // The writer goes on while the disk works: four more batches commit behind the held flush.
        let rest: Vec<_> = (2..=5).map(|k| insert(&w, k)).collect();
        until(|| visible(&path, 5), "the later commits").await;
        assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
        assert!(rest.iter().all(|h| !h.is_finished()));
        // One flush answers the first batch; ONE more covers every batch committed meanwhile.
        gate.open.send(Ok(())).unwrap();
        first.await.unwrap().unwrap();
        until(
            || gate.calls.load(Ordering::SeqCst) == 2,
            "the second flush",
        )
        .await;
        gate.open.send(Ok(())).unwrap();
        for h in rest {
            h.await.unwrap().unwrap();
        }
        assert_eq!(gate.calls.load(Ordering::SeqCst), 2, "one flush per group");
        assert!(d.is_settled());
        tokio::time::timeout(Duration::from_secs(5), d.settled())
            .await
            .expect("settled once flushed")
            .expect("the store is running");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_that_saw_an_unflushed_commit_waits_for_its_flush() {
        let dir = tempfile::tempdir().unwrap();
        let (w, gate, path) = gated(dir.path());
        let w = Arc::new(w);
        let d = w.durability();
        let first = insert(&w, 1);
        until(|| visible(&path, 1), "the commit").await;
        // A read that saw the row must not be shown before the row is durable.
        let waiting = {
            let d = d.clone();
            tokio::spawn(async move { d.settled().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "the read was released before the flush"
        );
        gate.open.send(Ok(())).unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("released by the flush")
            .unwrap()
            .expect("the store is running");
        first.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_flush_fails_its_writers_and_stops_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let (w, gate, path) = gated(dir.path());
        let w = Arc::new(w);
        let d = w.durability();
        let first = insert(&w, 1);
        until(|| gate.calls.load(Ordering::SeqCst) == 1, "the flush").await;
        gate.open
            .send(Err(std::io::Error::other("EIO from the test")))
            .unwrap();
        let err = first.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("EIO from the test")),
            "{err:?}"
        );
        assert!(!w.is_alive(), "the store goes on after a failed flush");
        // A later write is refused before it runs: nothing of it is committed, and no flush.
        let later = insert(&w, 2).await.unwrap().unwrap_err();
        assert!(matches!(later, StoreError::Unavailable(_)), "{later:?}");
        let r = Connection::open(&path).unwrap();
        let k2: i64 = r
            .query_row("SELECT COUNT(*) FROM t WHERE k = 2", [], |row| row.get(0))
            .unwrap();
        assert_eq!(k2, 0, "a refused write was committed");
        assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
        // A read may have seen the batch whose flush failed: it is refused, not shown.
        let read = d.settled().await.unwrap_err();
        assert!(
            matches!(&read, StoreError::Unavailable(m) if m.contains("EIO from the test")),
            "{read:?}"
        );
    }
}
