//! SQLite backend (DESIGN §7): one file under the data dir, WAL, `synchronous=FULL`, one group-commit
//! writer thread, and a small pool of read-only connections used from blocking tasks.

mod db;
mod durable;

pub(crate) use db::classify;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::Connection;

use crate::sql::{Backend, Db, SqlStore};
use crate::{StoreError, StoreResult};
use writer::{Writer, WriterOptions};

fn db(e: rusqlite::Error) -> StoreError {
    classify(&e)
}

/// Versioned migrations, applied in order; `PRAGMA user_version` records the last applied.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/sqlite/0001_init.sql")),
    (
        2,
        include_str!("../../migrations/sqlite/0002_idempotency.sql"),
    ),
    (3, include_str!("../../migrations/sqlite/0003_webhooks.sql")),
    (
        4,
        include_str!("../../migrations/sqlite/0004_webhook_standard.sql"),
    ),
    (5, include_str!("../../migrations/sqlite/0005_sessions.sql")),
    (
        6,
        include_str!("../../migrations/sqlite/0006_revocations_duplicates.sql"),
    ),
    (
        7,
        include_str!("../../migrations/sqlite/0007_attempt_message.sql"),
    ),
    (
        8,
        include_str!("../../migrations/sqlite/0008_lease_token.sql"),
    ),
    (
        9,
        include_str!("../../migrations/sqlite/0009_session_counters.sql"),
    ),
    (
        10,
        include_str!("../../migrations/sqlite/0010_config_sync.sql"),
    ),
    (
        11,
        include_str!("../../migrations/sqlite/0011_receipt_source_delivery_kind.sql"),
    ),
    (
        12,
        include_str!("../../migrations/sqlite/0012_session_bytes.sql"),
    ),
    (
        13,
        include_str!("../../migrations/sqlite/0013_receipt_deliveries.sql"),
    ),
    (
        14,
        include_str!("../../migrations/sqlite/0014_schedule_cursors.sql"),
    ),
    (
        15,
        include_str!("../../migrations/sqlite/0015_services.sql"),
    ),
    (
        16,
        include_str!("../../migrations/sqlite/0016_service_replicas.sql"),
    ),
    (
        17,
        include_str!("../../migrations/sqlite/0017_audit_console.sql"),
    ),
    (
        18,
        include_str!("../../migrations/sqlite/0018_ingress_counts_quarantine.sql"),
    ),
    (
        19,
        include_str!("../../migrations/sqlite/0019_delivery_trace_context.sql"),
    ),
    (
        20,
        include_str!("../../migrations/sqlite/0020_audit_breaks.sql"),
    ),
    (
        21,
        include_str!("../../migrations/sqlite/0021_receipt_body.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 21;

/// How long a statement waits for a lock held by another connection before failing with
/// [`StoreError::Busy`] (SQLite `busy_timeout`).
pub const DEFAULT_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Settings of a [`SqliteStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The writer thread's settings (queue bound).
    pub writer: WriterOptions,
    /// How long the writer waits for a database locked by another process before the batch fails with
    /// [`StoreError::Busy`]. Default [`DEFAULT_BUSY_TIMEOUT`] (10 s).
    pub busy_timeout: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            writer: WriterOptions::default(),
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

fn configure(conn: &Connection, read_only: bool) -> rusqlite::Result<()> {
    conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF; \
         PRAGMA temp_store = MEMORY;",
    )?;
    if read_only {
        conn.execute_batch("PRAGMA query_only = ON;")?;
    }
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Opens a connection to `path` with the store's connection settings (WAL, `synchronous=FULL`, cache and
/// busy timeout); [`Writer::start`] turns it to `synchronous=NORMAL` and flushes the WAL itself. Used by
/// the storage baseline benchmark so it commits the way the store does.
pub fn open_configured(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open(path).map_err(db)?;
    configure(&conn, false).map_err(db)?;
    Ok(conn)
}

/// Applies pending migrations; returns `(from_version, to_version)`.
pub fn migrate(conn: &Connection) -> StoreResult<(i64, i64)> {
    migrate_to(conn, SCHEMA_VERSION)
}

/// Applies the pending migrations up to version `to` (at most [`SCHEMA_VERSION`]), each in its own
/// transaction; returns `(from_version, to)`. [`migrate`] is this to the newest version; an older `to`
/// makes a store as an earlier release left it (the upgrade tests). Errors: the database is newer than
/// this build, or a migration failed (rolled back whole).
pub fn migrate_to(conn: &Connection, to: i64) -> StoreResult<(i64, i64)> {
    let from: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(db)?;
    if from > SCHEMA_VERSION {
        return Err(StoreError::Database(format!(
            "database schema version {from} is newer than this build knows ({SCHEMA_VERSION}); upgrade trigger-bridge"
        )));
    }
    let to = to.min(SCHEMA_VERSION);
    for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from && *v <= to) {
        let tx = conn.unchecked_transaction().map_err(db)?;
        tx.execute_batch(sql).map_err(db)?;
        tx.execute_batch(&format!("PRAGMA user_version = {v}"))
            .map_err(db)?;
        tx.commit().map_err(db)?;
    }
    Ok((from, to.max(from)))
}

/// The store's file in its data dir (`<data_dir>/trigger-bridge.db`, with its `-wal` and `-shm`).
pub const DB_FILE: &str = "trigger-bridge.db";

impl SqlStore<SqliteBackend> {
    /// Opens (creating if needed) `dir/`[`DB_FILE`], migrates it, and starts the writer.
    /// Errors: the directory cannot be created, the file cannot be opened, or a migration failed.
    pub fn open_dir(dir: &Path) -> StoreResult<SqliteStore> {
        Self::open_dir_with(dir, StoreOptions::default())
    }

    /// [`Self::open_dir`] with explicit [`StoreOptions`].
    pub fn open_dir_with(dir: &Path, opts: StoreOptions) -> StoreResult<SqliteStore> {
        crate::create_private_dir(dir).map_err(|e| {
            StoreError::Database(format!("cannot create data dir {}: {e}", dir.display()))
        })?;
        Self::open_with(&dir.join(DB_FILE), opts)
    }

    /// Opens (creating if needed) the database file at `path`, migrates it, and starts the writer.
    pub fn open(path: &Path) -> StoreResult<SqliteStore> {
        Self::open_with(path, StoreOptions::default())
    }

    /// [`Self::open`] with explicit [`StoreOptions`].
    pub fn open_with(path: &Path, opts: StoreOptions) -> StoreResult<SqliteStore> {
        let conn = Connection::open(path)
            .map_err(|e| StoreError::Database(format!("cannot open {}: {e}", path.display())))?;
        configure(&conn, false).map_err(db)?;
        migrate(&conn)?;
        conn.busy_timeout(opts.busy_timeout).map_err(db)?;
        let writer = Writer::start(conn, opts.writer);
        let durability = writer.durability();
        Ok(SqlStore::new(SqliteBackend {
            path: path.to_path_buf(),
            writer,
            durability,
            readers: Arc::new(Mutex::new(Vec::new())),
        }))
    }

    /// Whether the writer thread is running (false once it died or the store was closed).
    pub fn writer_alive(&self) -> bool {
        self.backend.writer.is_alive()
    }

    /// Test hook: runs `f` as one job of the writer's next group commit, exactly like a store write
    /// (its own savepoint; its error or panic rolls it back). Lets tests inject a panicking, blocking or
    /// failing job. Not for production use.
    #[doc(hidden)]
    pub async fn write_for_test<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.backend.writer.write(f).await
    }

    /// Test hook: makes the writer thread die (a panic outside the per-job guard). Not for production use.
    #[doc(hidden)]
    pub fn crash_writer_for_test(&self) -> StoreResult<()> {
        self.backend.writer.crash_for_test()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.backend.path
    }
}

/// The SQLite backend: one group-commit writer thread and a small pool of read-only connections.
pub struct SqliteBackend {
    path: PathBuf,
    writer: Writer,
    durability: Arc<durable::Durability>,
    readers: Arc<Mutex<Vec<Connection>>>,
}

/// The SQLite store. Cheap to share behind an `Arc<dyn Store>`.
pub type SqliteStore = SqlStore<SqliteBackend>;

impl SqliteBackend {
    /// Runs a short point read on the calling thread (no thread hop): for the ingest hot path's dedup
    /// probe, an index lookup of a few µs. Longer reads go through [`Self::read`].
    fn read_inline<T>(&self, f: impl FnOnce(&dyn Db) -> StoreResult<T>) -> StoreResult<T> {
        with_reader(&self.readers, &self.path, f)
    }

    async fn read_blocking<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let (pool, path) = (self.readers.clone(), self.path.clone());
        tokio::task::spawn_blocking(move || with_reader(&pool, &path, |c| in_snapshot(c, f)))
            .await
            .map_err(|e| StoreError::Database(format!("reader task failed: {e}")))?
    }
}

/// Most idle read-only connections the pool keeps.
const MAX_IDLE_READERS: usize = 8;

/// Runs `f` on an idle read-only connection of `pool` (opening one on `path` when none is idle) and
/// puts it back, keeping at most [`MAX_IDLE_READERS`]. Errors: opening failed, or `f`'s.
fn with_reader<T>(
    pool: &Mutex<Vec<Connection>>,
    path: &Path,
    f: impl FnOnce(&dyn Db) -> StoreResult<T>,
) -> StoreResult<T> {
    let idle = pool.lock().expect("reader pool").pop();
    let conn = match idle {
        Some(c) => c,
        None => {
            let c = Connection::open(path).map_err(db)?;
            configure(&c, true).map_err(db)?;
            c
        }
    };
    let r = f(&conn);
    let mut p = pool.lock().expect("reader pool");
    if p.len() < MAX_IDLE_READERS {
        p.push(conn);
    }
    r
}

/// Runs `f` in one deferred read transaction on `c`, so all of its statements read one WAL snapshot
/// (a page and its count agree); in autocommit each statement reads its own. Errors: `f`'s, or
/// `BEGIN` / `COMMIT` failing.
/// Point reads ([`SqliteBackend::read_inline`]) skip it: one statement needs no transaction.
fn in_snapshot<T>(c: &dyn Db, f: impl FnOnce(&dyn Db) -> StoreResult<T>) -> StoreResult<T> {
    c.exec("BEGIN", &[])?;
    let r = f(c);
    // A read transaction has nothing to keep: end it the same way whatever `f` returned.
    let end = c.exec("COMMIT", &[]);
    let r = r?;
    end?;
    Ok(r)
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write(f).await
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        let r = self.read_blocking(f).await;
        // Nothing is shown before it is durable (`durable`): a snapshot may hold a batch whose WAL
        // flush is still running.
        self.durability.settled().await?;
        r
    }

    async fn settled(&self) -> StoreResult<()> {
        self.durability.settled().await
    }

    async fn read_now<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.read_inline(f)
    }

    fn is_alive(&self) -> bool {
        self.writer.is_alive()
    }

    fn facts(&self) -> crate::BackendFacts {
        crate::BackendFacts {
            backend: "sqlite",
            connections: None,
        }
    }

    async fn close(&self) {
        self.writer.close().await;
    }
}
