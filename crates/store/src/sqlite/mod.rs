//! SQLite backend (DESIGN §7): one file under the data dir, WAL, `synchronous=FULL`, one group-commit
//! writer thread, and a small pool of read-only connections used from blocking tasks.

mod db;
mod read;
pub(crate) mod session;
mod write;

pub use session::waits::wait_view;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::Connection;
use serde_json::Value;
use tb_core::run::RunStatus;
use tb_core::subscription::{SubscriptionInput, Transition};

use crate::model::*;
use crate::session::*;
use crate::{Store, StoreError, StoreResult, StoredResult};
use read::db;
use writer::{Writer, WriterOptions};

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
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 7;

/// The SQLite store. Cheap to share behind an `Arc<dyn Store>`.
pub struct SqliteStore {
    path: PathBuf,
    writer: Writer,
    readers: Arc<Mutex<Vec<Connection>>>,
}

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

/// Opens a connection to `path` with exactly the store's write settings (WAL, `synchronous=FULL`,
/// cache and busy timeout). Used by the storage baseline benchmark so it commits the way the store does.
pub fn open_configured(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open(path).map_err(db)?;
    configure(&conn, false).map_err(db)?;
    Ok(conn)
}

/// Applies pending migrations; returns `(from_version, to_version)`.
pub fn migrate(conn: &Connection) -> StoreResult<(i64, i64)> {
    let from: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(db)?;
    if from > SCHEMA_VERSION {
        return Err(StoreError::Database(format!(
            "database schema version {from} is newer than this build knows ({SCHEMA_VERSION}); upgrade trigger-bridge"
        )));
    }
    for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > from) {
        let tx = conn.unchecked_transaction().map_err(db)?;
        tx.execute_batch(sql).map_err(db)?;
        tx.execute_batch(&format!("PRAGMA user_version = {v}"))
            .map_err(db)?;
        tx.commit().map_err(db)?;
    }
    Ok((from, SCHEMA_VERSION))
}

impl SqliteStore {
    /// Opens (creating if needed) `dir/trigger-bridge.db`, migrates it, and starts the writer.
    /// Errors: the directory cannot be created, the file cannot be opened, or a migration failed.
    pub fn open_dir(dir: &Path) -> StoreResult<SqliteStore> {
        Self::open_dir_with(dir, StoreOptions::default())
    }

    /// [`Self::open_dir`] with explicit [`StoreOptions`].
    pub fn open_dir_with(dir: &Path, opts: StoreOptions) -> StoreResult<SqliteStore> {
        crate::create_private_dir(dir).map_err(|e| {
            StoreError::Database(format!("cannot create data dir {}: {e}", dir.display()))
        })?;
        Self::open_with(&dir.join("trigger-bridge.db"), opts)
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
        Ok(SqliteStore {
            path: path.to_path_buf(),
            writer: Writer::start(conn, opts.writer),
            readers: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// Whether the writer thread is running (false once it died or the store was closed).
    pub fn writer_alive(&self) -> bool {
        self.writer.is_alive()
    }

    /// Test hook: runs `f` as one job of the writer's next group commit, exactly like a store write
    /// (its own savepoint; its error or panic rolls it back). Lets tests inject a panicking, blocking or
    /// failing job. Not for production use.
    #[doc(hidden)]
    pub async fn write_for_test<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write(f).await
    }

    /// Test hook: makes the writer thread die (a panic outside the per-job guard). Not for production use.
    #[doc(hidden)]
    pub fn crash_writer_for_test(&self) -> StoreResult<()> {
        self.writer.crash_for_test()
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs a short point read on the calling thread (no thread hop): for the ingest hot path's dedup
    /// probe, an index lookup of a few µs. Longer reads go through [`Self::read`].
    fn read_inline<T>(&self, f: impl FnOnce(&Connection) -> StoreResult<T>) -> StoreResult<T> {
        let conn = self.readers.lock().expect("reader pool").pop();
        let conn = match conn {
            Some(c) => c,
            None => {
                let c = Connection::open(&self.path).map_err(db)?;
                configure(&c, true).map_err(db)?;
                c
            }
        };
        let r = f(&conn);
        let mut p = self.readers.lock().expect("reader pool");
        if p.len() < 8 {
            p.push(conn);
        }
        r
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let pool = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = pool.lock().expect("reader pool").pop();
            let conn = match conn {
                Some(c) => c,
                None => {
                    let c = Connection::open(&path).map_err(db)?;
                    configure(&c, true).map_err(db)?;
                    c
                }
            };
            let r = f(&conn);
            let mut p = pool.lock().expect("reader pool");
            if p.len() < 8 {
                p.push(conn);
            }
            r
        })
        .await
        .map_err(|e| StoreError::Database(format!("reader task failed: {e}")))?
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn upsert_subscription(
        &self,
        def: SubscriptionDef,
        now: i64,
    ) -> StoreResult<SubscriptionRecord> {
        self.writer
            .write(move |c| write::upsert_subscription(c, &def, now))
            .await
    }
    async fn list_subscriptions(&self) -> StoreResult<Vec<SubscriptionRecord>> {
        self.read(read::list_subscriptions).await
    }
    async fn subscriptions_in_state(
        &self,
        state: tb_core::subscription::SubscriptionState,
    ) -> StoreResult<Vec<SubscriptionRecord>> {
        self.read(move |c| read::subscriptions_in_state(c, state))
            .await
    }
    async fn get_subscription(&self, id: &str) -> StoreResult<SubscriptionRecord> {
        let id = id.to_string();
        self.read(move |c| read::get_subscription(c, &id)).await
    }
    async fn apply_subscription_input(
        &self,
        id: &str,
        input: SubscriptionInput,
        now: i64,
    ) -> StoreResult<Option<Transition>> {
        let id = id.to_string();
        self.writer
            .write(move |c| write::apply_subscription_input(c, &id, input, now))
            .await
    }
    async fn find_duplicate(
        &self,
        subscription_id: &str,
        dedup_key: &str,
        now: i64,
    ) -> StoreResult<Option<IngestOutcome>> {
        self.read_inline(|c| read::duplicate_of(c, subscription_id, dedup_key, now))
    }
    async fn commit_receipt(&self, receipt: NewReceipt) -> StoreResult<IngestOutcome> {
        // Serialize here, on the caller's thread: the writer thread only executes SQL.
        let normalized = receipt.normalized.to_string();
        let inputs: Vec<String> = receipt
            .deliveries
            .iter()
            .map(|d| d.inputs.to_string())
            .collect();
        self.writer
            .write(move |c| write::commit_receipt(c, &receipt, &normalized, &inputs))
            .await
    }
    async fn lease_due(
        &self,
        owner: &str,
        now: i64,
        lease_ms: u64,
        limit: u32,
    ) -> StoreResult<Vec<Lease>> {
        let owner = owner.to_string();
        self.writer
            .write(move |c| write::lease_due(c, &owner, now, lease_ms, limit))
            .await
    }
    async fn commit_attempt(&self, commit: AttemptCommit) -> StoreResult<AttemptCommitted> {
        self.writer
            .write(move |c| write::commit_attempt(c, &commit))
            .await
    }
    async fn replay_delivery(&self, id: &str, now: i64) -> StoreResult<DeliveryRecord> {
        let id = id.to_string();
        self.writer
            .write(move |c| write::replay_delivery(c, &id, now))
            .await
    }
    async fn renew_lease(
        &self,
        delivery_id: &str,
        owner: &str,
        lease_until: i64,
        now: i64,
        lease_ms: u64,
    ) -> StoreResult<Option<i64>> {
        let (d, o) = (delivery_id.to_string(), owner.to_string());
        self.writer
            .write(move |c| write::renew_lease(c, &d, &o, lease_until, now, lease_ms))
            .await
    }
    async fn release_lease(&self, delivery_id: &str, owner: &str, now: i64) -> StoreResult<()> {
        let (d, o) = (delivery_id.to_string(), owner.to_string());
        self.writer
            .write(move |c| write::release_lease(c, &d, &o, now))
            .await
    }
    async fn next_due_at(&self) -> StoreResult<Option<i64>> {
        self.read(read::next_due_at).await
    }
    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        output: Option<Value>,
        now: i64,
    ) -> StoreResult<RunRecord> {
        let id = run_id.to_string();
        self.writer
            .write(move |c| write::finish_run(c, &id, status, output.as_ref(), now))
            .await
    }
    async fn get_run(&self, id: &str) -> StoreResult<RunRecord> {
        let id = id.to_string();
        self.read(move |c| read::get_run(c, &id)).await
    }
    async fn list_runs(&self, q: ListQuery) -> StoreResult<Vec<RunRecord>> {
        self.read(move |c| read::list_runs(c, &q)).await
    }
    async fn run_events(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: u32,
    ) -> StoreResult<Vec<RunEventRecord>> {
        let id = run_id.to_string();
        self.read(move |c| read::run_events(c, &id, after, limit))
            .await
    }
    async fn get_receipt(&self, id: &str) -> StoreResult<ReceiptRecord> {
        let id = id.to_string();
        self.read(move |c| read::get_receipt(c, &id)).await
    }
    async fn list_receipts(&self, q: ListQuery) -> StoreResult<Vec<ReceiptRecord>> {
        self.read(move |c| read::list_receipts(c, &q)).await
    }
    async fn get_body(&self, receipt_id: &str) -> StoreResult<Bytes> {
        let id = receipt_id.to_string();
        self.read(move |c| read::get_body(c, &id))
            .await
            .map(Bytes::from)
    }
    async fn get_delivery(&self, id: &str) -> StoreResult<DeliveryRecord> {
        let id = id.to_string();
        self.read(move |c| read::get_delivery(c, &id)).await
    }
    async fn list_deliveries(&self, q: ListQuery) -> StoreResult<Vec<DeliveryRecord>> {
        self.read(move |c| read::list_deliveries(c, &q)).await
    }
    async fn deliveries_of_receipt(&self, receipt_id: &str) -> StoreResult<Vec<DeliveryRecord>> {
        let id = receipt_id.to_string();
        self.read(move |c| read::deliveries_of_receipt(c, &id))
            .await
    }
    async fn attempts(&self, delivery_id: &str) -> StoreResult<Vec<AttemptRecord>> {
        let id = delivery_id.to_string();
        self.read(move |c| read::attempts(c, &id)).await
    }
    async fn subscription_events(
        &self,
        subscription_id: &str,
        limit: u32,
    ) -> StoreResult<Vec<SubscriptionEventRecord>> {
        let id = subscription_id.to_string();
        self.read(move |c| read::subscription_events(c, &id, limit))
            .await
    }
    async fn queue_depth(&self) -> StoreResult<QueueDepth> {
        self.read(read::queue_depth).await
    }
    async fn dead_letters(&self, q: DeadLetterQuery) -> StoreResult<Vec<DeadLetterRecord>> {
        self.read(move |c| read::dead_letters(c, &q)).await
    }
    async fn dead_letter_selection(&self, q: DeadLetterSelect) -> StoreResult<DeadLetterSelection> {
        self.read(move |c| read::dead_letter_selection(c, &q)).await
    }
    async fn idempotency_claim(
        &self,
        scope: &str,
        key: &str,
        digest: &str,
        now: i64,
        lease_ms: u64,
    ) -> StoreResult<IdempotencyClaim> {
        let (s, k, d) = (scope.to_string(), key.to_string(), digest.to_string());
        self.writer
            .write(move |c| write::idempotency_claim(c, &s, &k, &d, now, lease_ms))
            .await
    }
    async fn idempotency_release(
        &self,
        scope: &str,
        key: &str,
        lease_until: i64,
    ) -> StoreResult<bool> {
        let (s, k) = (scope.to_string(), key.to_string());
        self.writer
            .write(move |c| write::idempotency_release(c, &s, &k, lease_until))
            .await
    }
    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        reply: Option<StoredReply>,
        now: i64,
    ) -> StoredResult {
        let (s, k) = (scope.to_string(), key.to_string());
        self.writer
            .write(move |c| write::idempotency_finish(c, &s, &k, reply.as_ref(), now))
            .await
    }
    async fn sweep(
        &self,
        now: i64,
        bodies_before: i64,
        dead_letters_before: i64,
        batch: u32,
        cursor: SweepCursor,
    ) -> StoreResult<SweepPage> {
        self.writer
            .write(move |c| write::sweep(c, now, bodies_before, dead_letters_before, batch, cursor))
            .await
    }
    async fn create_webhook(&self, w: WebhookRecord, sub: SubscriptionDef) -> StoreResult<()> {
        self.writer
            .write(move |c| write::create_webhook(c, &w, &sub))
            .await
    }
    async fn delete_webhook(&self, id: &str, tenant: &str) -> StoreResult<()> {
        let (i, t) = (id.to_string(), tenant.to_string());
        self.writer
            .write(move |c| write::delete_webhook(c, &i, &t))
            .await
    }
    async fn list_webhooks(&self) -> StoreResult<Vec<WebhookRecord>> {
        self.read(read::list_webhooks).await
    }
    async fn get_run_event(&self, event_id: &str) -> StoreResult<RunEventRecord> {
        let id = event_id.to_string();
        self.read(move |c| read::get_run_event(c, &id)).await
    }
    async fn raise_signal(
        &self,
        run_id: &str,
        signal: NewSignal,
        now: i64,
    ) -> StoreResult<RaiseOutcome> {
        let r = run_id.to_string();
        self.writer
            .write(move |c| session::raise_signal(c, &r, &signal, now))
            .await
    }
    async fn list_signals(
        &self,
        run_id: &str,
        before: Option<u64>,
        limit: u32,
    ) -> StoreResult<SignalPage> {
        let r = run_id.to_string();
        self.read(move |c| session::list_signals(c, &r, before, limit))
            .await
    }
    async fn signal_payload(&self, run_id: &str, payload_ref: &str) -> StoreResult<Bytes> {
        let (r, p) = (run_id.to_string(), payload_ref.to_string());
        self.read(move |c| session::signal_payload(c, &r, &p))
            .await
            .map(Bytes::from)
    }
    async fn create_wait(
        &self,
        run_id: &str,
        wait_id: &str,
        spec: tb_core::wait::WaitSpec,
        now: i64,
    ) -> StoreResult<WaitRecord> {
        let (r, w) = (run_id.to_string(), wait_id.to_string());
        self.writer
            .write(move |c| session::create_wait(c, &r, &w, &spec, now))
            .await
    }
    async fn cancel_wait(&self, run_id: &str, wait_id: &str, now: i64) -> StoreResult<WaitRecord> {
        let (r, w) = (run_id.to_string(), wait_id.to_string());
        self.writer
            .write(move |c| session::cancel_wait(c, &r, &w, now))
            .await
    }
    async fn get_wait(&self, run_id: &str, wait_id: &str) -> StoreResult<WaitRecord> {
        let (r, w) = (run_id.to_string(), wait_id.to_string());
        self.read(move |c| session::get_wait(c, &r, &w)).await
    }
    async fn list_waits(&self, run_id: &str) -> StoreResult<Vec<WaitRecord>> {
        let r = run_id.to_string();
        self.read(move |c| session::list_waits(c, &r)).await
    }
    async fn fire_timers(&self, now: i64, limit: u32) -> StoreResult<u32> {
        self.writer
            .write(move |c| session::fire_timers(c, now, limit))
            .await
    }
    async fn next_timer_at(&self) -> StoreResult<Option<i64>> {
        self.read(session::next_timer_at).await
    }
    async fn enqueue_prompt(
        &self,
        run_id: &str,
        prompt: NewPrompt,
        now: i64,
    ) -> StoreResult<TurnRecord> {
        let r = run_id.to_string();
        self.writer
            .write(move |c| session::enqueue_prompt(c, &r, &prompt, now))
            .await
    }
    async fn claim_turn(
        &self,
        run_id: &str,
        lease_ms: u64,
        now: i64,
    ) -> StoreResult<Option<TurnRecord>> {
        let r = run_id.to_string();
        self.writer
            .write(move |c| session::claim_turn(c, &r, lease_ms, now))
            .await
    }
    async fn ack_turn(
        &self,
        run_id: &str,
        turn_id: &str,
        claim: u32,
        now: i64,
    ) -> StoreResult<TurnRecord> {
        let (r, t) = (run_id.to_string(), turn_id.to_string());
        self.writer
            .write(move |c| session::ack_turn(c, &r, &t, claim, now))
            .await
    }
    async fn list_turns(&self, run_id: &str) -> StoreResult<Vec<TurnRecord>> {
        let r = run_id.to_string();
        self.read(move |c| session::list_turns(c, &r)).await
    }
    async fn create_capability(&self, cap: CapabilityRecord, token_hash: String) -> StoredResult {
        self.writer
            .write(move |c| session::create_capability(c, &cap, &token_hash))
            .await
    }
    async fn list_capabilities(&self) -> StoreResult<Vec<CapabilityRecord>> {
        self.read(session::list_capabilities).await
    }
    async fn capability_by_hash(
        &self,
        token_hash: &str,
        now: i64,
    ) -> StoreResult<Option<CapabilityRecord>> {
        self.read_inline(|c| session::capability_by_hash(c, token_hash, now))
    }
    async fn revoke_capability(&self, id: &str, now: i64) -> StoreResult<CapabilityRecord> {
        let i = id.to_string();
        self.writer
            .write(move |c| session::revoke_capability(c, &i, now))
            .await
    }
    async fn revoke_binding(&self, id: &str, by: Option<String>, now: i64) -> StoreResult<bool> {
        let i = id.to_string();
        self.writer
            .write(move |c| write::revoke_binding(c, &i, by.as_deref(), now))
            .await
    }
    async fn restore_binding(&self, id: &str) -> StoreResult<bool> {
        let i = id.to_string();
        self.writer
            .write(move |c| write::restore_binding(c, &i))
            .await
    }
    async fn revoked_bindings(&self) -> StoreResult<Vec<(String, i64)>> {
        self.read(read::revoked_bindings).await
    }
    async fn add_duplicates(&self, counts: Vec<(String, u64, i64)>) -> StoredResult {
        self.writer
            .write(move |c| write::add_duplicates(c, &counts))
            .await
    }
    async fn ping_writer(&self) -> StoredResult {
        if !self.writer.is_alive() {
            return Err(StoreError::Unavailable(
                "the writer thread is not running".into(),
            ));
        }
        self.writer.write(|_| Ok(())).await
    }
    async fn close(&self) {
        self.writer.close().await;
    }
}
