//! `impl Store` written once for every backend: each method is one backend transaction running the shared
//! data-access code of [`read`], [`write`] and [`session`].

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;
use tb_core::run::RunStatus;
use tb_core::subscription::{SubscriptionInput, Transition};

use std::sync::Arc;

use super::batch::Batcher;
use super::ingest_batch::{self, ReceiptCommit};
use super::{attempt, attempt_batch, config, lease, read, session, write, Db};
use crate::model::*;
use crate::session::*;
use crate::sync::{ConfigChange, Wake};
use crate::{Store, StoreError, StoreResult, StoredResult};

/// How a backend runs the shared data-access code. The backend owns connections and transactions and
/// maps driver errors onto [`StoreError`]; it decides nothing.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Runs `f` in a write transaction and answers after COMMIT returned (durably). `f` may run more than
    /// once when the backend retries a transaction that lost a race ([`StoreError::Retryable`]), so it
    /// must not have effects outside the transaction: what a metric counts is recorded with
    /// `crate::after_commit::record`, and the backend emits the last run's facts when it answers. An
    /// `Err` from `f` rolls its writes back.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static;

    /// Runs `f` in a read-only transaction (one consistent snapshot).
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static;

    /// Runs a short point read (an index lookup of a few µs, the ingest path's dedup probe) as cheaply
    /// as the backend can: on the calling thread (SQLite), or in autocommit without `BEGIN`/`COMMIT`
    /// (PostgreSQL), so its statements need not share one snapshot. What it finds may be committed but
    /// not yet on disk (SQLite): call [`Self::settled`] before answering anyone with it.
    async fn read_now<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static;

    /// Waits until every commit a read that just ended could have seen is durable (SQLite answers a
    /// batch's writers only after its WAL flush, and a reader may see the batch in between; see
    /// `crate::sqlite::durable`). Default: at once (PostgreSQL shows a commit only once it is flushed).
    /// Errors: `Unavailable` once the store stopped (what the read saw may never be flushed).
    async fn settled(&self) -> StoreResult<()> {
        Ok(())
    }

    /// Whether the backend can take writes (its writer or pool is running).
    fn is_alive(&self) -> bool;

    /// A counter that changes soon after any replica committed a configuration change (PostgreSQL:
    /// `LISTEN`, see `crate::postgres::listen`); `None` where there is none (SQLite: one process, and
    /// the change log is polled anyway). A hint only: it may be late or lost; the log is the record.
    fn config_change_hints(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Tells the other replicas, soon and cheaply, that a change of kind `wake` was committed (no I/O
    /// on the caller's thread; PostgreSQL sends one debounced `NOTIFY` per channel from its own
    /// thread). Called by [`SqlStore`] after the commit returned. Default: nothing (SQLite).
    fn announce(&self, wake: crate::Wake) {
        let _ = wake;
    }

    /// The counter of wake-ups of kind `wake` announced by OTHER replicas (see
    /// [`crate::Store::wake_hints`]); `None` where there is none (SQLite).
    fn wake_hints(&self, wake: crate::Wake) -> Option<tokio::sync::watch::Receiver<u64>> {
        let _ = wake;
        None
    }

    /// How attempt and receipt commits are folded into transactions ([`super::batch`]). Default: one per
    /// transaction.
    fn batching(&self) -> super::batch::Batching {
        super::batch::Batching {
            max_items: 1,
            in_flight: 1,
            max_waiting: 10_000,
        }
    }

    /// Its name and live connections, for `/ready` (no I/O).
    fn facts(&self) -> crate::BackendFacts;

    /// Lets queued writes commit, then stops.
    async fn close(&self);
}

/// The store over a [`Backend`]: every [`Store`] method, backend-neutral.
pub struct SqlStore<B> {
    pub(crate) backend: Arc<B>,
    /// Attempt commits without a local effect, batched ([`attempt_batch`]).
    attempts: Batcher<AttemptCommit, AttemptCommitted>,
    /// Receipt commits, batched ([`ingest_batch`]).
    receipts: Batcher<ReceiptCommit, IngestOutcome>,
    /// No-op probes sent to the writer by [`Store::ping_writer`] ([`SqlStore::writer_pings`]).
    pings: std::sync::atomic::AtomicU64,
}

impl<B: Backend> SqlStore<B> {
    /// The store over `backend`.
    pub fn new(backend: B) -> Self {
        SqlStore {
            backend: Arc::new(backend),
            attempts: Batcher::new(attempt_batch::commit_attempts),
            receipts: Batcher::new(ingest_batch::commit_receipts),
            pings: Default::default(),
        }
    }

    /// How many no-op probes [`Store::ping_writer`] has sent to the writer since the store opened
    /// (each is one write job; `GET /ready` sends at most one per probe interval, docs/operations.md).
    pub fn writer_pings(&self) -> u64 {
        self.pings.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Passes `r` through, announcing `wake` to the other replicas when it is `Ok` (committed).
    fn wakes<T>(&self, wake: Wake, r: StoreResult<T>) -> StoreResult<T> {
        if r.is_ok() {
            self.backend.announce(wake);
        }
        r
    }

    /// The most receipt commits and attempt commits (in that order) one transaction has held so far
    /// ([`super::batch`]); `(0, 0)` on a backend that does not batch.
    pub fn largest_batches(&self) -> (usize, usize) {
        (self.receipts.largest(), self.attempts.largest())
    }

    /// The backend (for backend-specific inspection and test hooks).
    pub fn backend(&self) -> &B {
        &self.backend
    }
}

#[async_trait]
impl<B: Backend> Store for SqlStore<B> {
    async fn upsert_subscription(
        &self,
        def: SubscriptionDef,
        now: i64,
    ) -> StoreResult<SubscriptionRecord> {
        self.backend
            .write(move |c| write::upsert_subscription(c, &def, now))
            .await
    }
    async fn list_subscriptions(&self) -> StoreResult<Vec<SubscriptionRecord>> {
        self.backend.read(read::list_subscriptions).await
    }
    async fn subscriptions_in_state(
        &self,
        state: tb_core::subscription::SubscriptionState,
    ) -> StoreResult<Vec<SubscriptionRecord>> {
        self.backend
            .read(move |c| read::subscriptions_in_state(c, state))
            .await
    }
    async fn get_subscription(&self, id: &str) -> StoreResult<SubscriptionRecord> {
        let id = id.to_string();
        self.backend
            .read(move |c| read::get_subscription(c, &id))
            .await
    }
    async fn apply_subscription_input(
        &self,
        id: &str,
        input: SubscriptionInput,
        now: i64,
    ) -> StoreResult<Option<Transition>> {
        let id = id.to_string();
        self.backend
            .write(move |c| config::apply_subscription_input(c, &id, input, now))
            .await
    }
    fn probe_before_commit(&self) -> bool {
        // A backend that batches receipt commits finds a taken key in the batch's insert.
        self.backend.batching().max_items <= 1
    }
    async fn find_duplicate(
        &self,
        subscription_id: &str,
        dedup_key: &str,
        now: i64,
    ) -> StoreResult<Option<IngestOutcome>> {
        let (sub, key) = (subscription_id.to_string(), dedup_key.to_string());
        let found = self
            .backend
            .read_now(move |c| read::duplicate_of(c, &sub, &key, now))
            .await?;
        if found.is_some() {
            // A duplicate answer names a receipt: only once that receipt is durable.
            self.backend.settled().await?;
        }
        Ok(found)
    }
    async fn commit_receipt(&self, receipt: NewReceipt) -> StoreResult<IngestOutcome> {
        // Serialize here, on the caller's thread: the writer thread only executes SQL.
        let normalized = receipt.normalized.to_string();
        let inputs: Vec<String> = receipt
            .deliveries
            .iter()
            .map(|d| d.inputs.to_string())
            .collect();
        let due = receipt
            .deliveries
            .iter()
            .filter(|d| d.state == tb_core::delivery::DeliveryState::Pending)
            .count();
        let item = ReceiptCommit {
            receipt,
            normalized,
            inputs,
        };
        let out = self.receipts.submit(&self.backend, item).await;
        // Other replicas' workers are woken only for due deliveries the local worker was not handed.
        if matches!(&out, Ok(IngestOutcome::Accepted { leased, .. }) if leased.len() < due) {
            self.backend.announce(Wake::Work);
        }
        out
    }
    async fn lease_due(
        &self,
        owner: &str,
        now: i64,
        lease_ms: u64,
        limit: u32,
    ) -> StoreResult<Vec<Lease>> {
        let owner = owner.to_string();
        self.backend
            .write(move |c| lease::lease_due(c, &owner, now, lease_ms, limit))
            .await
    }
    async fn commit_attempt(&self, commit: AttemptCommit) -> StoreResult<AttemptCommitted> {
        // A local effect (a signal raised on a session, a session started) changes a session.
        if commit.effect.is_some() {
            let out = self
                .backend
                .write(move |c| attempt::commit_attempt(c, &commit))
                .await;
            return self.wakes(Wake::Sessions, out);
        }
        self.attempts.submit(&self.backend, commit).await
    }
    async fn replay_delivery(&self, id: &str, now: i64) -> StoreResult<DeliveryRecord> {
        let id = id.to_string();
        let out = self
            .backend
            .write(move |c| write::replay_delivery(c, &id, now))
            .await;
        self.wakes(Wake::Work, out)
    }
    async fn renew_lease(
        &self,
        delivery_id: &str,
        token: &str,
        now: i64,
        lease_ms: u64,
    ) -> StoreResult<i64> {
        let (d, t) = (delivery_id.to_string(), token.to_string());
        self.backend
            .write(move |c| lease::renew_lease(c, &d, &t, now, lease_ms))
            .await
    }
    async fn release_lease(&self, delivery_id: &str, token: &str, now: i64) -> StoreResult<()> {
        let (d, t) = (delivery_id.to_string(), token.to_string());
        let out = self
            .backend
            .write(move |c| lease::release_lease(c, &d, &t, now))
            .await;
        self.wakes(Wake::Work, out)
    }
    async fn next_due_at(&self) -> StoreResult<Option<i64>> {
        self.backend.read(read::next_due_at).await
    }
    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        output: Option<Value>,
        now: i64,
    ) -> StoreResult<RunRecord> {
        let id = run_id.to_string();
        let out = self
            .backend
            .write(move |c| write::finish_run(c, &id, status, output.as_ref(), now))
            .await;
        self.wakes(Wake::Sessions, out)
    }
    async fn get_run(&self, id: &str) -> StoreResult<RunRecord> {
        let id = id.to_string();
        self.backend.read(move |c| read::get_run(c, &id)).await
    }
    async fn list_runs(&self, q: ListQuery) -> StoreResult<Vec<RunRecord>> {
        self.backend.read(move |c| read::list_runs(c, &q)).await
    }
    async fn run_events(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: u32,
    ) -> StoreResult<Vec<RunEventRecord>> {
        let id = run_id.to_string();
        self.backend
            .read(move |c| read::run_events(c, &id, after, limit))
            .await
    }
    async fn get_receipt(&self, id: &str) -> StoreResult<ReceiptRecord> {
        // One primary-key lookup: a point read.
        let id = id.to_string();
        let r = self
            .backend
            .read_now(move |c| read::get_receipt(c, &id))
            .await;
        self.backend.settled().await?;
        r
    }
    async fn list_receipts(&self, q: ListQuery) -> StoreResult<Vec<ReceiptRecord>> {
        self.backend.read(move |c| read::list_receipts(c, &q)).await
    }
    async fn get_body(&self, receipt_id: &str) -> StoreResult<Bytes> {
        let id = receipt_id.to_string();
        self.backend
            .read(move |c| read::get_body(c, &id))
            .await
            .map(Bytes::from)
    }
    async fn get_delivery(&self, id: &str) -> StoreResult<DeliveryRecord> {
        let id = id.to_string();
        self.backend.read(move |c| read::get_delivery(c, &id)).await
    }
    async fn list_deliveries(&self, q: ListQuery) -> StoreResult<Vec<DeliveryRecord>> {
        self.backend
            .read(move |c| read::list_deliveries(c, &q))
            .await
    }
    async fn deliveries_of_receipt(&self, receipt_id: &str) -> StoreResult<Vec<DeliveryRecord>> {
        let id = receipt_id.to_string();
        self.backend
            .read(move |c| read::deliveries_of_receipt(c, &id))
            .await
    }
    async fn attempts(&self, delivery_id: &str) -> StoreResult<Vec<AttemptRecord>> {
        let id = delivery_id.to_string();
        self.backend.read(move |c| read::attempts(c, &id)).await
    }
    async fn subscription_events(
        &self,
        subscription_id: &str,
        limit: u32,
    ) -> StoreResult<Vec<SubscriptionEventRecord>> {
        let id = subscription_id.to_string();
        self.backend
            .read(move |c| read::subscription_events(c, &id, limit))
            .await
    }
    async fn queue_depth(&self) -> StoreResult<QueueDepth> {
        self.backend.read(read::queue_depth).await
    }
    async fn dead_letters(&self, q: DeadLetterQuery) -> StoreResult<Vec<DeadLetterRecord>> {
        self.backend.read(move |c| read::dead_letters(c, &q)).await
    }
    async fn dead_letter_selection(&self, q: DeadLetterSelect) -> StoreResult<DeadLetterSelection> {
        self.backend
            .read(move |c| read::dead_letter_selection(c, &q))
            .await
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
        self.backend
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
        self.backend
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
        self.backend
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
        self.backend
            .write(move |c| {
                write::sweep(
                    c,
                    now,
                    bodies_before,
                    dead_letters_before,
                    batch,
                    cursor.clone(),
                )
            })
            .await
    }
    async fn create_webhook(&self, w: WebhookRecord, sub: SubscriptionDef) -> StoreResult<()> {
        self.backend
            .write(move |c| config::create_webhook(c, &w, &sub, &[]))
            .await
    }
    async fn delete_webhook(&self, id: &str, tenant: &str) -> StoreResult<()> {
        let (i, t) = (id.to_string(), tenant.to_string());
        self.backend
            .write(move |c| config::delete_webhook(c, &i, &t, config::now_ms()))
            .await
    }
    async fn list_webhooks(&self) -> StoreResult<Vec<WebhookRecord>> {
        self.backend.read(read::list_webhooks).await
    }
    async fn get_run_event(&self, run_id: &str, event_id: &str) -> StoreResult<RunEventRecord> {
        let (run, id) = (run_id.to_string(), event_id.to_string());
        self.backend
            .read(move |c| read::get_run_event(c, &run, &id))
            .await
    }
    async fn raise_signal(
        &self,
        run_id: &str,
        signal: NewSignal,
        now: i64,
    ) -> StoreResult<RaiseOutcome> {
        let r = run_id.to_string();
        let out = self
            .backend
            .write(move |c| session::raise_signal(c, &r, &signal, now))
            .await;
        self.wakes(Wake::Sessions, out)
    }
    async fn list_signals(
        &self,
        run_id: &str,
        before: Option<u64>,
        limit: u32,
    ) -> StoreResult<SignalPage> {
        let r = run_id.to_string();
        self.backend
            .read(move |c| session::list_signals(c, &r, before, limit))
            .await
    }
    async fn signal_payload(&self, run_id: &str, payload_ref: &str) -> StoreResult<Bytes> {
        let (r, p) = (run_id.to_string(), payload_ref.to_string());
        self.backend
            .read(move |c| session::signal_payload(c, &r, &p))
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
        let out = self
            .backend
            .write(move |c| session::create_wait(c, &r, &w, &spec, now))
            .await;
        self.wakes(Wake::Sessions, out)
    }
    async fn cancel_wait(&self, run_id: &str, wait_id: &str, now: i64) -> StoreResult<WaitRecord> {
        let (r, w) = (run_id.to_string(), wait_id.to_string());
        let out = self
            .backend
            .write(move |c| session::cancel_wait(c, &r, &w, now))
            .await;
        self.wakes(Wake::Sessions, out)
    }
    async fn get_wait(&self, run_id: &str, wait_id: &str) -> StoreResult<WaitRecord> {
        let (r, w) = (run_id.to_string(), wait_id.to_string());
        self.backend
            .read(move |c| session::get_wait(c, &r, &w))
            .await
    }
    async fn list_waits(&self, run_id: &str) -> StoreResult<Vec<WaitRecord>> {
        let r = run_id.to_string();
        self.backend.read(move |c| session::list_waits(c, &r)).await
    }
    async fn fire_timers(&self, now: i64, limit: u32) -> StoreResult<u32> {
        let out = self
            .backend
            .write(move |c| session::fire_timers(c, now, limit))
            .await;
        if matches!(out, Ok(n) if n > 0) {
            self.backend.announce(Wake::Sessions);
        }
        out
    }
    async fn next_timer_at(&self) -> StoreResult<Option<i64>> {
        self.backend.read(session::next_timer_at).await
    }
    async fn enqueue_prompt(
        &self,
        run_id: &str,
        prompt: NewPrompt,
        now: i64,
    ) -> StoreResult<TurnRecord> {
        let r = run_id.to_string();
        let out = self
            .backend
            .write(move |c| session::enqueue_prompt(c, &r, &prompt, now))
            .await;
        self.wakes(Wake::Sessions, out)
    }
    async fn claim_turn(
        &self,
        run_id: &str,
        lease_ms: u64,
        now: i64,
    ) -> StoreResult<Option<TurnRecord>> {
        let r = run_id.to_string();
        self.backend
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
        let out = self
            .backend
            .write(move |c| session::ack_turn(c, &r, &t, claim, now))
            .await;
        self.wakes(Wake::Sessions, out)
    }
    async fn list_turns(&self, run_id: &str) -> StoreResult<Vec<TurnRecord>> {
        let r = run_id.to_string();
        self.backend.read(move |c| session::list_turns(c, &r)).await
    }
    async fn create_capability_sealed(
        &self,
        cap: CapabilityRecord,
        token_hash: String,
        sealed_hmac: Option<Vec<u8>>,
    ) -> StoredResult {
        self.backend
            .write(move |c| {
                session::create_capability(c, &cap, &token_hash)?;
                match &sealed_hmac {
                    Some(s) => config::put_sealed_secret(c, &cap.id, s, cap.created_at),
                    None => Ok(()),
                }
            })
            .await
    }
    async fn create_capability(&self, cap: CapabilityRecord, token_hash: String) -> StoredResult {
        self.backend
            .write(move |c| session::create_capability(c, &cap, &token_hash))
            .await
    }
    async fn list_capabilities(&self) -> StoreResult<Vec<CapabilityRecord>> {
        self.backend.read(session::list_capabilities).await
    }
    async fn capability_by_hash(
        &self,
        token_hash: &str,
        now: i64,
    ) -> StoreResult<Option<CapabilityRecord>> {
        let hash = token_hash.to_string();
        let found = self
            .backend
            .read_now(move |c| session::capability_by_hash(c, &hash, now))
            .await?;
        if found.is_some() {
            self.backend.settled().await?;
        }
        Ok(found)
    }
    async fn revoke_capability(&self, id: &str, now: i64) -> StoreResult<CapabilityRecord> {
        let i = id.to_string();
        self.backend
            .write(move |c| config::revoke_capability(c, &i, now))
            .await
    }
    async fn revoke_binding(&self, id: &str, by: Option<String>, now: i64) -> StoreResult<bool> {
        let i = id.to_string();
        self.backend
            .write(move |c| config::revoke_binding(c, &i, by.as_deref(), now))
            .await
    }
    async fn restore_binding(&self, id: &str) -> StoreResult<bool> {
        let i = id.to_string();
        self.backend
            .write(move |c| config::restore_binding(c, &i, config::now_ms()))
            .await
    }
    async fn revoked_bindings(&self) -> StoreResult<Vec<(String, i64)>> {
        self.backend.read(read::revoked_bindings).await
    }
    async fn add_duplicates(&self, counts: Vec<(String, u64, i64)>) -> StoredResult {
        self.backend
            .write(move |c| write::add_duplicates(c, &counts))
            .await
    }
    fn config_change_hints(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.backend.config_change_hints()
    }
    fn wake_hints(&self, wake: Wake) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.backend.wake_hints(wake)
    }
    async fn changes_since(&self, after_id: i64, limit: u32) -> StoreResult<Vec<ConfigChange>> {
        self.backend
            .read(move |c| config::changes_since(c, after_id, limit))
            .await
    }
    async fn config_change_head(&self) -> StoreResult<i64> {
        self.backend.read(config::head).await
    }
    async fn register_subscription(
        &self,
        def: SubscriptionDef,
        sealed_secrets: Vec<(String, Vec<u8>)>,
        now: i64,
    ) -> StoreResult<SubscriptionRecord> {
        self.backend
            .write(move |c| config::register_subscription(c, &def, &sealed_secrets, now))
            .await
    }
    async fn rotate_subscription_secret(
        &self,
        def: SubscriptionDef,
        expected: Option<Vec<u8>>,
        sealed_secrets: Vec<(String, Vec<u8>)>,
        remove: Vec<String>,
        now: i64,
    ) -> StoreResult<SubscriptionRecord> {
        self.backend
            .write(move |c| {
                config::rotate_subscription_secret(
                    c,
                    &def,
                    expected.as_deref(),
                    &sealed_secrets,
                    &remove,
                    now,
                )
            })
            .await
    }
    async fn drop_ended_previous_secret(
        &self,
        id: &str,
        previous_id: &str,
        now: i64,
    ) -> StoreResult<bool> {
        let (id, previous_id) = (id.to_string(), previous_id.to_string());
        self.backend
            .write(move |c| config::drop_ended_previous_secret(c, &id, &previous_id, now))
            .await
    }
    async fn sealed_secret(&self, id: &str) -> StoreResult<Option<Vec<u8>>> {
        let id = id.to_string();
        self.backend
            .read(move |c| config::sealed_secret(c, &id))
            .await
    }
    async fn create_webhook_sealed(
        &self,
        w: WebhookRecord,
        sub: SubscriptionDef,
        secrets: Vec<(String, Vec<u8>)>,
    ) -> StoreResult<()> {
        self.backend
            .write(move |c| config::create_webhook(c, &w, &sub, &secrets))
            .await
    }
    async fn ping_writer(&self) -> StoredResult {
        if !self.backend.is_alive() {
            return Err(StoreError::Unavailable(
                "the writer thread is not running".into(),
            ));
        }
        self.pings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.backend.write(|_| Ok(())).await
    }
    fn facts(&self) -> crate::BackendFacts {
        self.backend.facts()
    }
    async fn close(&self) {
        self.backend.close().await;
    }
    async fn register_new_subscription(
        &self,
        def: SubscriptionDef,
        now: i64,
    ) -> StoreResult<Option<SubscriptionRecord>> {
        self.backend
            .write(move |c| config::register_new_subscription(c, &def, now))
            .await
    }
    async fn register_service(
        &self,
        name: &str,
        version: &str,
        manifest: serde_json::Value,
        hash: &str,
        now: i64,
    ) -> StoreResult<crate::ServiceRecord> {
        let (n, v, m, h) = (
            name.to_string(),
            version.to_string(),
            manifest.to_string(),
            hash.to_string(),
        );
        self.backend
            .write(move |c| super::services::register(c, &n, &v, &m, &h, now))
            .await
    }
    async fn get_service(&self, name: &str) -> StoreResult<Option<crate::ServiceRecord>> {
        let n = name.to_string();
        self.backend
            .read(move |c| super::services::get(c, &n))
            .await
    }
    async fn list_services(&self) -> StoreResult<Vec<crate::ServiceRecord>> {
        self.backend.read(super::services::all).await
    }
    async fn service_heartbeat(
        &self,
        name: &str,
        started_at: &str,
        hash: &str,
        shutting_down: bool,
        now: i64,
    ) -> StoreResult<bool> {
        let (n, s, h) = (name.to_string(), started_at.to_string(), hash.to_string());
        self.backend
            .write(move |c| super::services::heartbeat(c, &n, &s, &h, shutting_down, now))
            .await
    }
    async fn add_ingress_counts(
        &self,
        counts: Vec<crate::IngressCount>,
        prune_before: Option<i64>,
    ) -> StoreResult<Vec<u64>> {
        self.backend
            .write(move |c| write::add_ingress_counts(c, &counts, prune_before))
            .await
    }
    async fn ingress_counts(
        &self,
        q: crate::IngressCountQuery,
    ) -> StoreResult<Vec<crate::IngressCount>> {
        self.backend
            .read(move |c| read::ingress_counts(c, &q))
            .await
    }
    async fn admitted_totals(&self, minute: i64) -> StoreResult<Vec<crate::IngressCount>> {
        self.backend
            .read(move |c| read::admitted_totals(c, minute))
            .await
    }
    async fn quarantine_subscription(&self, q: crate::QuarantineRecord) -> StoreResult<bool> {
        self.backend
            .write(move |c| config::quarantine_subscription(c, &q))
            .await
    }
    async fn release_subscription(&self, id: &str, now: i64) -> StoreResult<bool> {
        let i = id.to_string();
        self.backend
            .write(move |c| config::release_subscription(c, &i, now))
            .await
    }
    async fn quarantines(&self) -> StoreResult<Vec<crate::QuarantineRecord>> {
        self.backend.read(read::quarantines).await
    }
    async fn activity(&self, since: i64) -> StoreResult<crate::Activity> {
        self.backend.read(move |c| read::activity(c, since)).await
    }
    async fn append_audit(
        &self,
        e: tb_core::audit::NewEntry,
        key: Option<tb_core::audit::Key>,
    ) -> StoreResult<tb_core::audit::Appended> {
        self.backend
            .write(move |c| super::audit::append(c, e.clone(), key.as_ref()))
            .await
    }
    async fn audit_entries(&self, q: crate::AuditQuery) -> StoreResult<Vec<tb_core::audit::Entry>> {
        self.backend.read(move |c| super::audit::list(c, &q)).await
    }
    async fn audit_head(&self) -> StoreResult<crate::AuditHead> {
        self.backend.read(super::audit::head).await
    }
    async fn create_console_login(&self, login: crate::ConsoleLogin) -> StoredResult {
        self.backend
            .write(move |c| super::audit::create_login(c, &login))
            .await
    }
    async fn console_login(
        &self,
        token_sha256: &str,
        now: i64,
    ) -> StoreResult<Option<crate::ConsoleLogin>> {
        let t = token_sha256.to_string();
        self.backend
            .read(move |c| super::audit::get_login(c, &t, now))
            .await
    }
    async fn prune_console_logins(&self, keep: Vec<String>) -> StoreResult<u64> {
        self.backend
            .write(move |c| super::audit::prune_logins(c, &keep))
            .await
    }
    async fn delete_console_login(&self, token_sha256: &str) -> StoreResult<bool> {
        let t = token_sha256.to_string();
        self.backend
            .write(move |c| super::audit::delete_login(c, &t))
            .await
    }
    async fn schedule_cursors(&self) -> StoreResult<Vec<crate::ScheduleCursorRecord>> {
        self.backend.read(super::schedule::all).await
    }
    async fn schedule_cursor(&self, id: &str) -> StoreResult<Option<crate::ScheduleCursorRecord>> {
        let i = id.to_string();
        self.backend
            .read(move |c| super::schedule::get(c, &i))
            .await
    }
    async fn put_schedule_cursor(
        &self,
        id: &str,
        cursor: tb_core::schedule::plan::Cursor,
        expected: Option<i64>,
        now: i64,
    ) -> StoreResult<bool> {
        let i = id.to_string();
        self.backend
            .write(move |c| super::schedule::put(c, &i, &cursor, expected, now))
            .await
    }
}
