//! The connection pool of the PostgreSQL backend: N threads, each owning one connection, take jobs from
//! one bounded queue. A job is one transaction at READ COMMITTED: `BEGIN`, the job's data access through
//! [`Db`], `COMMIT`. Correctness comes from row locks (`SELECT ... FOR UPDATE`, see
//! [`Dialect::for_update`](crate::sql::Dialect::for_update)) and constraints, never from there being one
//! writer; several pools (replicas) may share one database.
//!
//! Failure rules (the same as the SQLite writer's, `crate::sqlite::writer`):
//! - the queue is bounded ([`PoolOptions::queue_capacity`] jobs); a job that finds it full gets
//!   [`StoreError::Busy`] at once;
//! - a job that loses a race the database can detect (serialization failure `40001`, deadlock
//!   `40P01`: [`StoreError::Retryable`]) is rolled back and run again, up to [`MAX_RETRIES`] times
//!   after a short random pause, then its caller gets the `Retryable` error;
//! - a job that panics is caught: its transaction is rolled back, its caller gets
//!   [`StoreError::Database`], and the thread goes on;
//! - a connection that broke is replaced before the next job (a job whose `BEGIN` failed on it runs on
//!   the new connection; one that failed later gets [`StoreError::Unavailable`], since its fate at
//!   `COMMIT` may be unknown);
//! - [`PgPool::close`] stops taking jobs, lets the threads run what is queued, and joins them.
//!
//! Each thread owns a current-thread Tokio runtime and one `tokio_postgres::Client` whose connection
//! task runs on that runtime; the job's statements run with `block_on` ([`PgDb`]). A transaction's
//! `BEGIN` goes out with its first statement (no round trip of its own); `COMMIT` is awaited (the
//! caller's answer depends on it); `ROLLBACK` too (rare: the job failed).

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio_postgres::Client;

use super::config::connect_async;
use super::db::{PgDb, StatementCache};
use super::error::{classify, connection_lost};
use crate::after_commit;
use crate::sql::Db;
use crate::{StoreError, StoreResult};

/// Default number of connections (and threads) of a pool.
pub const DEFAULT_CONNECTIONS: usize = 8;

/// Default bound of the job queue, in jobs (as the SQLite writer's).
pub const DEFAULT_QUEUE_CAPACITY: usize = 10_000;

/// How many times a job that failed with [`StoreError::Retryable`] is run again (so at most
/// `MAX_RETRIES + 1` runs).
pub const MAX_RETRIES: u32 = 5;

/// Longest pause before a retry, in ms (the pause is random, up to `2^retry` ms, capped here).
pub const MAX_BACKOFF_MS: u64 = 50;

/// Added to the pause of a deadlock victim's retry, per retry, in ms (see `backoff`).
pub const DEADLOCK_BACKOFF_MS: u64 = 25;

/// Settings of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Connections, one thread each (at least 1). Default [`DEFAULT_CONNECTIONS`].
    pub connections: usize,
    /// Jobs that may wait for a connection (at least 1); a job beyond it is refused with
    /// [`StoreError::Busy`]. Default [`DEFAULT_QUEUE_CAPACITY`].
    pub queue_capacity: usize,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            connections: DEFAULT_CONNECTIONS,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
        }
    }
}

/// Whether a job may write: a read runs in a `READ ONLY` transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    /// A short read of one or two indexed statements, run in autocommit (no `BEGIN`/`COMMIT`).
    Point,
}

trait Job: Send {
    fn access(&self) -> Access;
    /// Runs the job's function once inside an open transaction, keeping its value. A panic is caught
    /// and becomes [`StoreError::Database`]. An error makes the caller roll back.
    fn run(&mut self, db: &dyn Db) -> StoreResult<()>;
    /// Answers the caller with the job's fate (the last run's value when `Ok`).
    fn finish(self: Box<Self>, r: StoreResult<()>);
}

struct TypedJob<T, F> {
    access: Access,
    f: F,
    out: Option<T>,
    /// What the last run recorded for metrics, and whether that run's closure failed: emitted by
    /// [`Job::finish`] by the job's fate (`crate::after_commit`).
    facts: Vec<after_commit::Fact>,
    refused: bool,
    reply: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for TypedJob<T, F>
where
    T: Send + 'static,
    F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
{
    fn access(&self) -> Access {
        self.access
    }

    fn run(&mut self, db: &dyn Db) -> StoreResult<()> {
        let f = &mut self.f;
        after_commit::start();
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| f(db))).unwrap_or_else(|p| {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            tracing::error!(panic = %what, "PostgreSQL job panicked; rolled back");
            metrics::counter!("tb_pg_job_panics_total").increment(1);
            Err(StoreError::Database(format!(
                "job panicked and was rolled back: {what}"
            )))
        });
        self.facts = after_commit::take();
        self.refused = r.is_err();
        r.map(|v| self.out = Some(v))
    }

    fn finish(self: Box<Self>, r: StoreResult<()>) {
        let TypedJob {
            out,
            reply,
            facts,
            refused,
            ..
        } = *self;
        let fate = match (&r, refused) {
            (Ok(()), _) => after_commit::Fate::Committed,
            (Err(_), true) => after_commit::Fate::Refused,
            (Err(_), false) => after_commit::Fate::Lost,
        };
        after_commit::emit(facts, fate);
        let r = r.and_then(|()| out.ok_or_else(|| StoreError::Database("job did not run".into())));
        let _ = reply.send(r);
    }
}

/// A pool of PostgreSQL connections, each on its own thread, running jobs as transactions.
pub struct PgPool {
    tx: Mutex<Option<SyncSender<Box<dyn Job>>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    live: Arc<AtomicUsize>,
    capacity: usize,
    connections: usize,
    /// Network round trips of every connection so far ([`PgPool::round_trips`]).
    trips: Arc<AtomicU64>,
}

/// One connection thread's state: its settings, its runtime (which drives the client's connection
/// task), its client (`None` after it broke) and the statements prepared on that client.
struct Conn {
    cfg: tokio_postgres::Config,
    rt: Runtime,
    client: Option<Client>,
    cache: RefCell<StatementCache>,
    /// The pool's count of round trips.
    trips: Arc<AtomicU64>,
}

impl Conn {
    /// Drops a broken client and its statements; the next job connects anew.
    fn reset(&mut self) {
        self.client = None;
        self.cache.get_mut().clear();
    }
}

/// Decrements the pool's count of live threads when a thread ends, however it ends.
struct LiveGuard(Arc<AtomicUsize>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
        if std::thread::panicking() {
            tracing::error!("a PostgreSQL connection thread died");
        }
    }
}

impl PgPool {
    /// Opens `opts.connections` connections on `cfg` (see
    /// [`parse_url`](super::config::parse_url)), one thread each, and waits until each connected.
    /// Blocking (up to the connect timeout): call it outside async code or in `spawn_blocking`.
    /// Errors: the first connection's failure ([`StoreError::Unavailable`] when the server cannot
    /// be reached); then no thread is left running.
    pub fn start(cfg: &tokio_postgres::Config, opts: PoolOptions) -> StoreResult<PgPool> {
        let n = opts.connections.max(1);
        let capacity = opts.queue_capacity.max(1);
        let (tx, rx) = mpsc::sync_channel::<Box<dyn Job>>(capacity);
        let rx = Arc::new(Mutex::new(rx));
        let live = Arc::new(AtomicUsize::new(0));
        let trips = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel::<StoreResult<()>>();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let (cfg, rx, ready) = (cfg.clone(), rx.clone(), ready_tx.clone());
            let conn_trips = trips.clone();
            live.fetch_add(1, Ordering::SeqCst);
            let guard = LiveGuard(live.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("tb-pg-{i}"))
                .spawn(move || {
                    let _guard = guard;
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready.send(Err(StoreError::Unavailable(format!(
                                "cannot start a PostgreSQL connection runtime: {e}"
                            ))));
                            return;
                        }
                    };
                    let client = match connect_async(&rt, &cfg) {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    drop(ready);
                    let mut conn = Conn {
                        cfg,
                        rt,
                        client: Some(client),
                        cache: RefCell::new(StatementCache::new()),
                        trips: conn_trips,
                    };
                    run_loop(&mut conn, &rx);
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    live.fetch_sub(1, Ordering::SeqCst);
                    let _ = ready_tx.send(Err(StoreError::Unavailable(format!(
                        "cannot start a PostgreSQL connection thread: {e}"
                    ))));
                }
            }
        }
        drop(ready_tx);
        let pool = PgPool {
            tx: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
            live,
            capacity,
            connections: n,
            trips,
        };
        // Every thread answers once: connected or not (bounded by the connect timeout).
        let mut first_err = None;
        for r in ready_rx.iter() {
            if let (Err(e), None) = (r, &first_err) {
                first_err = Some(e);
            }
        }
        match first_err {
            None => Ok(pool),
            Some(e) => {
                for t in pool.shut() {
                    let _ = t.join(); // connected threads see the closed queue and end at once
                }
                Err(e)
            }
        }
    }

    /// Jobs that may wait for a connection ([`PoolOptions::queue_capacity`]).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Connections the pool was started with.
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// Network round trips to the server of every connection so far: one per message the driver awaits
    /// an answer to (a pipeline of statements with the `BEGIN` sent with it, a statement's preparation,
    /// a `COMMIT`, a `ROLLBACK`). What the store's pipelining is measured by
    /// (`tests/statement_shapes.rs`); the connection's own setup is not counted.
    pub fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }

    /// Connection threads still running.
    pub fn live_connections(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Runs `f` in a read-write transaction at READ COMMITTED on the next free connection and
    /// returns its value once `COMMIT` returned. `f` may run more than once (see [`MAX_RETRIES`]):
    /// it must do nothing but data access through the [`Db`] it gets. Errors: `Busy` (queue full),
    /// `Unavailable` (closed, no connection, connection lost), `Retryable` (lost the race every
    /// time), `Database` (a statement failed or the job panicked), or `f`'s own error (rolled back).
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Access::Write, f).await
    }

    /// As [`PgPool::write`], in a `REPEATABLE READ READ ONLY` transaction: one snapshot for all of
    /// its statements; a statement that writes fails with `Database`, SQLSTATE `25006`.
    pub async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Access::Read, f).await
    }

    /// A point read (the ingest path's dedup probe: one or two index lookups) in autocommit: no
    /// `BEGIN`/`COMMIT` round trips, so each statement reads its own snapshot, and nothing stops `f`
    /// from writing: only for reads whose statements stay consistent one by one. Errors as
    /// [`PgPool::read`].
    pub async fn read_point<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.submit(Access::Point, f).await
    }

    /// Readiness probe: runs `SELECT 1` through the queue and a connection. Errors as [`PgPool::read`].
    pub async fn ping(&self) -> StoreResult<()> {
        let one = self
            .read(|db| db.value::<i64>("SELECT 1", crate::p![]))
            .await?;
        match one {
            Some(1) => Ok(()),
            other => Err(StoreError::Database(format!("SELECT 1 answered {other:?}"))),
        }
    }

    async fn submit<T, F>(&self, access: Access, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        self.enqueue(Box::new(TypedJob {
            access,
            f,
            out: None,
            facts: Vec::new(),
            refused: false,
            reply,
        }))?;
        rx.await.map_err(|_| {
            StoreError::Unavailable("the PostgreSQL connection thread stopped".into())
        })?
    }

    fn enqueue(&self, job: Box<dyn Job>) -> StoreResult<()> {
        let guard = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(tx) = guard.as_ref() else {
            return Err(StoreError::Unavailable("store is closed".into()));
        };
        if self.live.load(Ordering::SeqCst) == 0 {
            return Err(StoreError::Unavailable(
                "no PostgreSQL connection thread is running".into(),
            ));
        }
        tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => {
                metrics::counter!("tb_pg_busy_total").increment(1);
                StoreError::Busy(format!(
                    "the PostgreSQL job queue is full ({} jobs); retry shortly",
                    self.capacity
                ))
            }
            TrySendError::Disconnected(_) => {
                StoreError::Unavailable("no PostgreSQL connection thread is running".into())
            }
        })
    }

    /// Stops taking jobs; returns the threads to join (they end once the queue is drained).
    fn shut(&self) -> Vec<JoinHandle<()>> {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Stops taking jobs (later ones get `Unavailable`), lets the threads run every queued job, and
    /// joins them.
    pub async fn close(&self) {
        let threads = self.shut();
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

impl Drop for PgPool {
    /// Stops taking jobs; the threads finish the queue and end on their own (not joined).
    fn drop(&mut self) {
        self.shut();
    }
}

fn run_loop(conn: &mut Conn, rx: &Mutex<Receiver<Box<dyn Job>>>) {
    loop {
        // One thread waits on the channel at a time; the others wait for the lock.
        let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(mut job) = next else {
            return; // closed and drained
        };
        let r = run_job(conn, job.as_mut());
        job.finish(r);
    }
}

/// How one run of a job ended.
enum Run {
    /// `BEGIN` failed because the connection is gone: nothing of the job ran.
    NotBegun(StoreError),
    /// The job ran: committed (`Ok`) or rolled back with this error.
    Done(StoreResult<()>),
}

/// Runs a job to its end: retries on [`StoreError::Retryable`] (up to [`MAX_RETRIES`]) and on a
/// connection found broken at `BEGIN` (once, after reconnecting).
fn run_job(conn: &mut Conn, job: &mut dyn Job) -> StoreResult<()> {
    let mut retries = 0;
    let mut reconnected = false;
    loop {
        match run_once(conn, job) {
            Run::NotBegun(e) if !reconnected => {
                tracing::warn!(error = %e, "PostgreSQL connection lost; reconnecting");
                reconnected = true;
            }
            Run::NotBegun(e) => return Err(e),
            Run::Done(Err(StoreError::Retryable(m))) if retries < MAX_RETRIES => {
                retries += 1;
                metrics::counter!("tb_pg_retries_total").increment(1);
                tracing::debug!(retry = retries, error = %m, "PostgreSQL transaction retried");
                std::thread::sleep(backoff(retries, m.contains("SQLSTATE 40P01")));
            }
            Run::Done(r) => return r,
        }
    }
}

/// A random pause before retry number `retry` (1-based): uniform in `[0.5, 2^retry]` ms, at most
/// [`MAX_BACKOFF_MS`], so two transactions that collided do not collide again in lockstep. A deadlock
/// victim (`deadlock`, SQLSTATE `40P01`) waits [`DEADLOCK_BACKOFF_MS`] x `retry` more (still at most
/// [`MAX_BACKOFF_MS`]): its locks were freed when it was aborted, and the transaction it deadlocked
/// with must be scheduled and take them before the victim's retry takes its first lock again; on the
/// loaded 2-core test machine a 0.5-2 ms pause, and 5 ms more, lost that race about one time in four
/// (the victim deadlocked again, up to three times in a row; `a_deadlock_is_retried_and_both_jobs_succeed`
/// in `tests/postgres_adapter.rs`), 25 ms more did not in 15 runs. After the server's `deadlock_timeout`
/// (1 s by default) this costs nothing.
fn backoff(retry: u32, deadlock: bool) -> Duration {
    let cap_us = (1000u64 << retry.min(16)).min(MAX_BACKOFF_MS * 1000);
    let jitter = 500 + super::random_u64() % cap_us.saturating_sub(500).max(1);
    let extra = if deadlock {
        DEADLOCK_BACKOFF_MS * 1000 * u64::from(retry)
    } else {
        0
    };
    Duration::from_micros((jitter + extra).min(MAX_BACKOFF_MS * 1000))
}

fn run_once(conn: &mut Conn, job: &mut dyn Job) -> Run {
    if conn.client.is_none() {
        match connect_async(&conn.rt, &conn.cfg) {
            Ok(c) => {
                metrics::counter!("tb_pg_reconnects_total").increment(1);
                conn.client = Some(c);
            }
            Err(e) => return Run::Done(Err(e)),
        }
    }
    let client = conn.client.as_ref().expect("connected above");
    let (run, lost) = in_transaction(client, &conn.rt, &conn.cache, &conn.trips, job);
    if lost {
        conn.reset();
    }
    run
}

/// The `BEGIN` of a job's transaction: READ COMMITTED for a write; for a read `REPEATABLE READ
/// READ ONLY`, so all of its statements see one snapshot (a page and its count agree). A read-only
/// transaction never fails to serialize, so this costs no retries.
fn begin_sql(access: Access) -> &'static str {
    match access {
        Access::Read => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        _ => "BEGIN ISOLATION LEVEL READ COMMITTED",
    }
}

/// [`begin_sql`] and `COMMIT` in one simple-protocol message: the transaction of a job that ran no
/// statement.
fn empty_transaction(access: Access) -> &'static str {
    match access {
        Access::Read => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; COMMIT",
        _ => "BEGIN ISOLATION LEVEL READ COMMITTED; COMMIT",
    }
}

/// One run of `job` in one transaction on `client` (driven on `rt`); also tells whether the
/// connection must be replaced (it closed, or an error said it is gone or unusable). The `BEGIN` is
/// sent with the job's first statement; a job that runs no statement sends `BEGIN; COMMIT` as one
/// message ([`empty_transaction`]), so it still fails, or reconnects, with its connection.
fn in_transaction(
    client: &Client,
    rt: &Runtime,
    cache: &RefCell<StatementCache>,
    trips: &AtomicU64,
    job: &mut dyn Job,
) -> (Run, bool) {
    if job.access() == Access::Point {
        let r = {
            let db = PgDb::autocommit(client, rt, cache, trips);
            job.run(&db)
        };
        let lost = client.is_closed() || matches!(r, Err(StoreError::Unavailable(_)));
        return (Run::Done(r), lost);
    }
    let db = PgDb::transaction(client, rt, cache, trips, begin_sql(job.access()));
    let r = job.run(&db);
    if let Some(e) = db.take_begin_error() {
        // Nothing of the job ran in a transaction. A BEGIN that failed on a live connection (it
        // should never) leaves the connection in doubt: it is replaced too.
        let err = classify(&e);
        return if connection_lost(&e) {
            (Run::NotBegun(err), true)
        } else {
            (Run::Done(Err(err)), true)
        };
    }
    let begun = db.begun();
    let write = job.access() == Access::Write;
    if begun || r.is_ok() {
        // The COMMIT, the ROLLBACK, or the empty transaction below.
        trips.fetch_add(1, Ordering::Relaxed);
    }
    let r = match r {
        Ok(()) => {
            let committed = if begun {
                rt.block_on(client.batch_execute("COMMIT"))
                    .map_err(|e| classify(&e))
            } else {
                // No statement ran (the writer probe): the empty transaction still goes to the
                // server, as one message, so the job answers for its connection.
                match rt.block_on(client.batch_execute(empty_transaction(job.access()))) {
                    Err(e) if connection_lost(&e) => return (Run::NotBegun(classify(&e)), true),
                    other => other.map_err(|e| classify(&e)),
                }
            };
            committed.inspect(|()| {
                if write {
                    // One job, one transaction (the bench reports transactions per event from this).
                    metrics::counter!("tb_store_transactions_total", "backend" => "postgres")
                        .increment(1);
                    metrics::counter!("tb_store_write_jobs_total", "backend" => "postgres")
                        .increment(1);
                }
            })
        }
        Err(e) => {
            if begun {
                let _ = rt.block_on(client.batch_execute("ROLLBACK"));
            }
            Err(e)
        }
    };
    let lost = client.is_closed() || matches!(r, Err(StoreError::Unavailable(_)));
    (Run::Done(r), lost)
}
