//! The Store API (DESIGN §6, §7) and its backends.
//!
//! Callers hold an `Arc<dyn Store>` and never see SQL. Every write that must be atomic is ONE method here
//! (a receipt with its body and deliveries; an attempt with its delivery update, events, run and
//! subscription transition), so a backend can keep the promises of DESIGN §5 with its own transactions.
//! The SQLite backend group-commits all writes through one writer thread; the PostgreSQL backend will claim
//! work with `FOR UPDATE SKIP LOCKED`. One behaviour suite (`tests/behaviour.rs`) runs against every backend.

mod after_commit;
pub mod copy;
pub mod model;
pub mod postgres;
pub mod session;
pub mod sql;
pub mod sqlite;
pub mod sync;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;
use tb_core::run::RunStatus;
use tb_core::subscription::{SubscriptionInput, Transition};

pub use model::*;
pub use session::*;
pub use sync::{ChangeKind, ConfigChange, Wake};

/// Creates `dir` and any missing parents readable by the owner only (`0700` on Unix): a data dir holds
/// raw webhook bodies and secrets. An existing directory keeps its mode. Errors: the OS error.
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Store errors. `code()` maps them onto the API's stable error codes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// No such record; the text is `"<kind> not found"` (`run not found`), naming the kind of record and
    /// never an id taken from the request. Callers match on `kind`, never on the text.
    #[error("{kind} not found")]
    NotFound { kind: RecordKind },
    /// A state conflict (e.g. completing a run that is already terminal).
    #[error("{0}")]
    Conflict(String),
    /// The delivery's lease expired and moved on; the attempt's result is discarded.
    #[error("lease lost for delivery {0}")]
    LeaseLost(String),
    /// The store is shutting down, its writer is gone, or the disk is full.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Transient overload: the writer queue is full or the database is locked by another process; nothing
    /// was written. The API answers 503 `unavailable` with `Retry-After: 1`.
    #[error("store busy: {0}")]
    Busy(String),
    /// The transaction lost a race it can win by running again (PostgreSQL serialization failure or
    /// deadlock, `40001`/`40P01`); nothing was written. Backends retry such a transaction a few times
    /// before passing this on; the API answers 503 `unavailable` with `Retry-After: 1`.
    #[error("store conflict, retry: {0}")]
    Retryable(String),
    #[error("database error: {0}")]
    Database(String),
    /// A rule refused the operation (e.g. `target_terminal`, `signal_buffer_full`); nothing was written.
    #[error("{message}")]
    Rejected {
        code: tb_core::ErrorCode,
        message: String,
    },
}

/// The kind of record a [`StoreError::NotFound`] names. Its [`std::fmt::Display`] is the text of the
/// error message ("run" in "run not found"), kept as it was when the kind was a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    Subscription,
    Receipt,
    /// The raw body of a receipt (gone after the body retention, or never kept for a refusal record).
    ReceiptBody,
    Delivery,
    Run,
    /// One event of a run's log, by run and sequence.
    RunEvent,
    Wait,
    Turn,
    /// The stored bytes behind a signal's `payloadRef`.
    SignalPayload,
    /// A minted capability endpoint (`POST /v1/hooks/{token}`).
    Capability,
    /// An outbound webhook registration.
    Webhook,
}

impl RecordKind {
    /// The words naming the kind in messages (`run`, `receipt body`, `capability endpoint`).
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Subscription => "subscription",
            RecordKind::Receipt => "receipt",
            RecordKind::ReceiptBody => "receipt body",
            RecordKind::Delivery => "delivery",
            RecordKind::Run => "run",
            RecordKind::RunEvent => "run event",
            RecordKind::Wait => "wait",
            RecordKind::Turn => "turn",
            RecordKind::SignalPayload => "signal payload",
            RecordKind::Capability => "capability endpoint",
            RecordKind::Webhook => "webhook",
        }
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StoreError {
    /// `NotFound { kind }`: `"<kind> not found"`.
    pub fn not_found(kind: RecordKind) -> StoreError {
        StoreError::NotFound { kind }
    }

    /// The API error code for this error.
    pub fn code(&self) -> tb_core::ErrorCode {
        use tb_core::ErrorCode as C;
        match self {
            StoreError::NotFound { .. } => C::NotFound,
            StoreError::Conflict(_) | StoreError::LeaseLost(_) => C::Conflict,
            StoreError::Unavailable(_) | StoreError::Busy(_) | StoreError::Retryable(_) => {
                C::Unavailable
            }
            StoreError::Database(_) => C::Internal,
            StoreError::Rejected { code, .. } => *code,
        }
    }
}

/// Result alias.
pub type StoreResult<T> = Result<T, StoreError>;
/// Result of a write that returns nothing.
pub type StoredResult = StoreResult<()>;

/// Which backend a store runs on and how many connections it holds, for `GET /ready` and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendFacts {
    /// `"sqlite"`, `"postgresql"`, or `"unknown"` (a store that does not say).
    pub backend: &'static str,
    /// PostgreSQL: the pool's connection threads still running (0 = unreachable since start). SQLite:
    /// `None` (one writer thread, no connections to count).
    pub connections: Option<usize>,
}

/// The durable state of trigger-bridge. Implemented by [`sql::SqlStore`] over SQLite
/// ([`sqlite::SqliteStore`]) and PostgreSQL ([`postgres::PgStore`]).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    // --- subscriptions -------------------------------------------------------------------------
    /// Creates the subscription (state `active`) or updates its source/connector/config, keeping state.
    async fn upsert_subscription(
        &self,
        def: SubscriptionDef,
        now: i64,
    ) -> StoreResult<SubscriptionRecord>;
    /// Lists subscriptions ordered by id.
    async fn list_subscriptions(&self) -> StoreResult<Vec<SubscriptionRecord>>;
    /// Subscriptions in `state` (e.g. `dead-lettered`, for `/ready` and the start-up warning), ordered
    /// by id, each with `state_since` (ms) and `last_error`.
    async fn subscriptions_in_state(
        &self,
        state: tb_core::subscription::SubscriptionState,
    ) -> StoreResult<Vec<SubscriptionRecord>>;
    /// One subscription; `NotFound` if absent.
    async fn get_subscription(&self, id: &str) -> StoreResult<SubscriptionRecord>;
    /// Applies an operator input (pause / resume) through the core state machine and records the
    /// `trigger.subscription.state.changed` event in the same transaction. `None` if nothing changed.
    async fn apply_subscription_input(
        &self,
        id: &str,
        input: SubscriptionInput,
        now: i64,
    ) -> StoreResult<Option<Transition>>;

    // --- ingest ----------------------------------------------------------------------------------
    /// Whether a [`Store::find_duplicate`] probe before each commit pays: SQLite answers it on the
    /// caller's thread while a commit waits for the writer (`true`); PostgreSQL's batched commits find
    /// a taken key in their own insert, and the probe is one more statement per new receipt
    /// (`false`). The engine still probes where the answer must come before other checks (a rate
    /// limit, a paused subscription, an endpoint's run). Default `true`.
    fn probe_before_commit(&self) -> bool {
        true
    }

    /// Read-only dedup probe (no write, no fsync): the receipt holding the key at `now` (ms), within
    /// its dedup window, if any.
    async fn find_duplicate(
        &self,
        subscription_id: &str,
        dedup_key: &str,
        now: i64,
    ) -> StoreResult<Option<IngestOutcome>>;
    /// Commits receipt + body + deliveries atomically and durably. A key still held by an earlier
    /// receipt (before that receipt's `dedup_until`) gives `Duplicate`; a key whose window has passed
    /// is released and taken by the new receipt.
    async fn commit_receipt(&self, receipt: NewReceipt) -> StoreResult<IngestOutcome>;

    // --- delivery worker -----------------------------------------------------------------------------
    /// Leases up to `limit` due deliveries (`pending`/`retrying`, `due_at <= now`: a leased delivery's
    /// `due_at` is its lease's end) to `owner` (display only) until `now + lease_ms` (Unix ms, ms; the
    /// caller's clock), each with a fresh fencing token (`tb_core::lease::grant`). On PostgreSQL the
    /// candidates are taken `FOR UPDATE SKIP LOCKED`, so replicas leasing at once take disjoint batches.
    async fn lease_due(
        &self,
        owner: &str,
        now: i64,
        lease_ms: u64,
        limit: u32,
    ) -> StoreResult<Vec<Lease>>;
    /// Records one attempt and everything that follows from it, atomically (see [`AttemptCommit`]).
    /// Errors: `LeaseLost` (the token no longer holds the delivery); `Rejected` (its local effect was
    /// refused; nothing written).
    async fn commit_attempt(&self, commit: AttemptCommit) -> StoreResult<AttemptCommitted>;
    /// Puts a dead-lettered delivery back in the queue, due at `now`, and its receipt back to `routed`
    /// (`tb_core::replay::reopen`). Attempt numbers continue (a replay after 3 attempts is attempt 4)
    /// and each replay grants one attempt beyond the retry policy. Errors: `NotFound`; `Conflict`
    /// unless the delivery is dead-lettered.
    async fn replay_delivery(&self, id: &str, now: i64) -> StoreResult<DeliveryRecord>;
    /// Heartbeat of an attempt in flight: extends the lease of grant `token` to `now + lease_ms`
    /// (Unix ms, ms) and returns the new end (`tb_core::lease::renew`). Errors: `LeaseLost` (nothing
    /// written) when the row carries another token (re-leased, released, completed), the delivery is
    /// terminal, or the lease already lapsed (`lease_until <= now`), so a lapsed holder never extends
    /// another holder's lease; `NotFound`.
    async fn renew_lease(
        &self,
        delivery_id: &str,
        token: &str,
        now: i64,
        lease_ms: u64,
    ) -> StoreResult<i64>;
    /// Releases the lease of grant `token` without recording an attempt; the delivery is due again at
    /// `now` (Unix ms; `tb_core::lease::release`). Errors: `LeaseLost` (nothing written) when `token`
    /// no longer holds it; `NotFound`.
    async fn release_lease(&self, delivery_id: &str, token: &str, now: i64) -> StoreResult<()>;
    /// The earliest `due_at` of open deliveries, for the worker's sleep.
    async fn next_due_at(&self) -> StoreResult<Option<i64>>;

    // --- runs ------------------------------------------------------------------------------------------
    /// Ends a running run with a terminal status and appends its terminal event.
    /// Errors: `NotFound`; `Conflict` if already terminal or `status` is not terminal.
    async fn finish_run(
        &self,
        run_id: &str,
        status: RunStatus,
        output: Option<Value>,
        now: i64,
    ) -> StoreResult<RunRecord>;
    async fn get_run(&self, id: &str) -> StoreResult<RunRecord>;
    async fn list_runs(&self, q: ListQuery) -> StoreResult<Vec<RunRecord>>;
    /// Events of a run with `sequence > after` (all when `after` is `None`), ascending, at most `limit`.
    async fn run_events(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: u32,
    ) -> StoreResult<Vec<RunEventRecord>>;

    // --- inspection ------------------------------------------------------------------------------------
    async fn get_receipt(&self, id: &str) -> StoreResult<ReceiptRecord>;
    async fn list_receipts(&self, q: ListQuery) -> StoreResult<Vec<ReceiptRecord>>;
    /// The exact stored request bytes of a receipt.
    async fn get_body(&self, receipt_id: &str) -> StoreResult<Bytes>;
    async fn get_delivery(&self, id: &str) -> StoreResult<DeliveryRecord>;
    async fn list_deliveries(&self, q: ListQuery) -> StoreResult<Vec<DeliveryRecord>>;
    async fn deliveries_of_receipt(&self, receipt_id: &str) -> StoreResult<Vec<DeliveryRecord>>;
    async fn attempts(&self, delivery_id: &str) -> StoreResult<Vec<AttemptRecord>>;
    async fn subscription_events(
        &self,
        subscription_id: &str,
        limit: u32,
    ) -> StoreResult<Vec<SubscriptionEventRecord>>;
    async fn queue_depth(&self) -> StoreResult<QueueDepth>;
    /// One page of a subscription's dead-lettered deliveries, newest first (RFC 0232).
    async fn dead_letters(&self, q: DeadLetterQuery) -> StoreResult<Vec<DeadLetterRecord>>;
    /// The dead letters of a subscription a bulk replay selects: their count and the first
    /// `q.limit` ids, oldest first (by `(dead-lettered at, id)`), from one snapshot.
    async fn dead_letter_selection(&self, q: DeadLetterSelect) -> StoreResult<DeadLetterSelection>;
    /// Claims an HTTP `Idempotency-Key` (OpenWOP Layer 1) atomically: `New` (this request runs; the
    /// record is pending with a lease of `lease_ms`), `InFlight` (another request holds it),
    /// `Mismatch` (same key, different request digest) or `Replay` (the stored final answer). Expired
    /// records (24 h) and lapsed leases are taken over.
    async fn idempotency_claim(
        &self,
        scope: &str,
        key: &str,
        digest: &str,
        now: i64,
        lease_ms: u64,
    ) -> StoreResult<IdempotencyClaim>;
    /// Drops the pending claim of `(scope, key)` only if it is still the one [`IdempotencyClaim::New`]
    /// answered with `lease_until` (ms) (a claim taken over after its lease, or finished, is kept), so
    /// a retry runs at once instead of waiting out the lease. For a request dropped before its answer
    /// was stored (the client went away). Returns whether a claim was dropped.
    async fn idempotency_release(
        &self,
        scope: &str,
        key: &str,
        lease_until: i64,
    ) -> StoreResult<bool>;
    /// Stores the final answer of a claimed key, or (with `None`) drops the claim so a retry runs again.
    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        reply: Option<StoredReply>,
        now: i64,
    ) -> StoredResult;
    /// One batch of a retention pass (DESIGN §7 retention; RFC 0232 purge), resuming at `cursor`: examines
    /// at most `batch` rows per kind in key order and deletes the raw bodies of settled receipts received
    /// before `bodies_before` (ms) and the dead-lettered deliveries (with their attempts) dead-lettered
    /// before `dead_letters_before` (ms) among them (rules: `tb_core::retention`), plus at most `batch`
    /// idempotency records expired at `now` (ms) and at most `batch` settled signal records (consumed,
    /// dropped, expired) settled before `bodies_before`, with their payloads (a signal holds event content
    /// like a raw body; each run's newest signal stays so its arrival numbers are never reused). Receipts, runs and events are kept. Call again with
    /// the page's `next` until it is `None`; a row is examined once per pass, deleted or not.
    async fn sweep(
        &self,
        now: i64,
        bodies_before: i64,
        dead_letters_before: i64,
        batch: u32,
        cursor: SweepCursor,
    ) -> StoreResult<SweepPage>;
    /// Registers an outbound webhook and its trigger-subscription row (one transaction).
    async fn create_webhook(&self, w: WebhookRecord, sub: SubscriptionDef) -> StoreResult<()>;
    /// Deletes (tombstones) a webhook of `tenant`; no further deliveries are created for it.
    /// Errors: `NotFound` (unknown, deleted, or another tenant's).
    async fn delete_webhook(&self, id: &str, tenant: &str) -> StoreResult<()>;
    /// Live webhooks.
    async fn list_webhooks(&self) -> StoreResult<Vec<WebhookRecord>>;
    /// One event of run `run_id` by its id, its payload as built. Errors: `NotFound`.
    async fn get_run_event(&self, run_id: &str, event_id: &str) -> StoreResult<RunEventRecord>;
    // --- sessions: signals, waits, turns ------------------------------------------------
    /// Raises a signal on a run (signals-and-connectors §5.2): duplicate `signalId`s are recorded and
    /// suppressed, a full mailbox follows its policy, and the armed wait may consume it at once.
    /// Errors: `NotFound`; `Rejected(target_terminal | signal_buffer_full)`.
    async fn raise_signal(
        &self,
        run_id: &str,
        signal: NewSignal,
        now: i64,
    ) -> StoreResult<RaiseOutcome>;
    /// One page of a run's mailbox, newest first: signals (buffered, consumed, dropped, expired) whose
    /// arrival number `seq` is below `before` (all when `None`), at most `limit`, and the run's buffered
    /// count. Settled signals expire with the body retention ([`Store::sweep`]). Errors: `NotFound`.
    async fn list_signals(
        &self,
        run_id: &str,
        before: Option<u64>,
        limit: u32,
    ) -> StoreResult<SignalPage>;
    /// The bytes behind a signal's `payloadRef`. Errors: `NotFound`.
    async fn signal_payload(&self, run_id: &str, payload_ref: &str) -> StoreResult<Bytes>;
    /// Arms a wait (replacing an armed one) and resolves it at once when a candidate is already visible.
    /// Errors: `NotFound`; `Rejected(target_terminal)`.
    async fn create_wait(
        &self,
        run_id: &str,
        wait_id: &str,
        spec: tb_core::wait::WaitSpec,
        now: i64,
    ) -> StoreResult<WaitRecord>;
    /// Cancels an armed wait. Errors: `NotFound`; `Conflict` when it is not armed.
    async fn cancel_wait(&self, run_id: &str, wait_id: &str, now: i64) -> StoreResult<WaitRecord>;
    async fn get_wait(&self, run_id: &str, wait_id: &str) -> StoreResult<WaitRecord>;
    async fn list_waits(&self, run_id: &str) -> StoreResult<Vec<WaitRecord>>;
    /// Resolves armed waits whose deadline passed (timer winner unless a stronger candidate is
    /// visible); at most `limit`. Returns how many resolved.
    async fn fire_timers(&self, now: i64, limit: u32) -> StoreResult<u32>;
    /// The earliest deadline of an armed (not interrupted) wait.
    async fn next_timer_at(&self) -> StoreResult<Option<i64>>;
    /// Enqueues user input as a prompt turn; it interrupts an armed signal wait or wins an `any` wait.
    /// Errors: `NotFound`; `Rejected(target_terminal)`.
    async fn enqueue_prompt(
        &self,
        run_id: &str,
        prompt: NewPrompt,
        now: i64,
    ) -> StoreResult<TurnRecord>;
    /// Claims the run's next turn for `lease_ms` (one at a time, in order). Errors: `NotFound`;
    /// `Rejected(target_terminal)` once the run ended.
    async fn claim_turn(
        &self,
        run_id: &str,
        lease_ms: u64,
        now: i64,
    ) -> StoreResult<Option<TurnRecord>>;
    /// Acknowledges a claimed turn (re-arming a wait it interrupted). `claim` is the turn's `claims`
    /// count the driver got with it: an older claim (its lease lapsed and the turn went to someone else)
    /// is refused. Errors: `NotFound`; `Conflict`; `Rejected(target_terminal)` once the run ended.
    async fn ack_turn(
        &self,
        run_id: &str,
        turn_id: &str,
        claim: u32,
        now: i64,
    ) -> StoreResult<TurnRecord>;
    async fn list_turns(&self, run_id: &str) -> StoreResult<Vec<TurnRecord>>;

    // --- capability endpoints (signals-and-connectors §4) -------------------------------------------
    /// Stores a minted endpoint; the token only as its hash. Errors: `NotFound`; `Rejected(target_terminal)`.
    async fn create_capability(&self, cap: CapabilityRecord, token_hash: String) -> StoredResult;
    /// [`Store::create_capability`] with the endpoint's sealed HMAC key (when given; sealed by the
    /// engine, never plaintext) stored under the capability id in the same transaction, so every
    /// replica can verify its requests. Errors: as `create_capability`.
    async fn create_capability_sealed(
        &self,
        cap: CapabilityRecord,
        token_hash: String,
        sealed_hmac: Option<Vec<u8>>,
    ) -> StoredResult;
    async fn list_capabilities(&self) -> StoreResult<Vec<CapabilityRecord>>;
    /// A usable endpoint (not revoked, not expired, uses left) by token hash.
    async fn capability_by_hash(
        &self,
        token_hash: &str,
        now: i64,
    ) -> StoreResult<Option<CapabilityRecord>>;
    /// Revokes at once; revoking again changes nothing (the first `revokedAt` stays). Errors: `NotFound`.
    async fn revoke_capability(&self, id: &str, now: i64) -> StoreResult<CapabilityRecord>;

    // --- bindings and duplicates ------------------------------------------------------------------
    /// Revokes a binding (idempotent); `false` when it was already revoked.
    async fn revoke_binding(&self, id: &str, by: Option<String>, now: i64) -> StoreResult<bool>;
    /// Lifts a revocation; `false` when the binding was not revoked.
    async fn restore_binding(&self, id: &str) -> StoreResult<bool>;
    /// Revoked binding ids with the time of revocation.
    async fn revoked_bindings(&self) -> StoreResult<Vec<(String, i64)>>;
    /// Adds `(receipt id, duplicate count, last duplicate time ms)` to receipts' duplicate counters.
    async fn add_duplicates(&self, counts: Vec<(String, u64, i64)>) -> StoredResult;

    // --- configuration across replicas (DESIGN §9) ------------------------------------
    /// The configuration changes with `id > after_id`, ascending, at most `limit` (a primary-key
    /// range read). Every change another replica must see (operator pause / resume, binding revoke /
    /// restore, registration, outbound webhook create / delete, capability revoke) appends one row in
    /// its own transaction; ids are handed out in commit order, so `after_id` = the last id read never
    /// misses a change.
    async fn changes_since(&self, after_id: i64, limit: u32) -> StoreResult<Vec<ConfigChange>>;
    /// The id of the newest configuration change (0 when none): where a starting replica begins to
    /// poll, read BEFORE it loads its caches.
    async fn config_change_head(&self) -> StoreResult<i64>;
    /// A counter that changes soon after a configuration change was committed by any replica, so a
    /// poller of [`Store::changes_since`] can read at once (PostgreSQL: `LISTEN` on a channel only
    /// configuration changes notify; the first call starts one listener connection). `None` where the
    /// backend has none (SQLite). A hint: it may be late or lost (while the listener reconnects); the
    /// change log stays the record and must still be polled.
    fn config_change_hints(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// A counter that changes soon after another replica committed a change of kind `wake` (deliveries
    /// that became due; a session change), so idle workers and long-polls wake at once instead of at
    /// their next poll (PostgreSQL: `LISTEN`, with the senders' `NOTIFY` debounced per channel, never
    /// one per row; see `postgres::notify`). This replica's own changes are not echoed: it wakes its
    /// own sleepers in-process. `None` where the backend has none (SQLite: one process). A hint only:
    /// it may be late or lost while the listener reconnects (it then bumps once); sleepers still poll.
    fn wake_hints(&self, wake: Wake) -> Option<tokio::sync::watch::Receiver<u64>> {
        let _ = wake;
        None
    }
    /// Registers (or rewrites) a trigger subscription through the API in one transaction: the
    /// subscription row (as [`Store::upsert_subscription`]), its sealed secrets `(secret id, sealed
    /// bytes)` (sealed by the engine, never plaintext; a given id is replaced) and its
    /// [`ChangeKind::Registration`] change row. A rotation writes the new secret under the subscription
    /// id and the previous one beside it in the same commit, so no replica ever loads half of it.
    async fn register_subscription(
        &self,
        def: SubscriptionDef,
        sealed_secrets: Vec<(String, Vec<u8>)>,
        now: i64,
    ) -> StoreResult<SubscriptionRecord>;
    /// A rotation of a registered subscription's secret ([`Store::register_subscription`] after a check):
    /// the subscription row is locked, and the secret sealed under its id must still be `expected`
    /// (what the caller read before sealing the new one; `None` for a secret kept in a file), so two
    /// rotations racing on any replicas never both win. `remove` names sealed secrets deleted in the
    /// same commit (an ended overlap's previous secret). Errors: `NotFound` (no such subscription);
    /// `Conflict` (the secret changed meanwhile; nothing written).
    async fn rotate_subscription_secret(
        &self,
        def: SubscriptionDef,
        expected: Option<Vec<u8>>,
        sealed_secrets: Vec<(String, Vec<u8>)>,
        remove: Vec<String>,
        now: i64,
    ) -> StoreResult<SubscriptionRecord>;
    /// Deletes the sealed previous secret `previous_id` of subscription `id` when the overlap its row
    /// records has ended at `now` (Unix ms) or is gone; the row is locked first, so a rotation committed
    /// meanwhile keeps its secret. Returns whether one was deleted. Errors: the store's.
    async fn drop_ended_previous_secret(
        &self,
        id: &str,
        previous_id: &str,
        now: i64,
    ) -> StoreResult<bool>;
    /// The sealed secret stored under `id` (a registered subscription id, or a webhook secret id), if any.
    async fn sealed_secret(&self, id: &str) -> StoreResult<Option<Vec<u8>>>;
    /// [`Store::create_webhook`] with the webhook's sealed secrets `(secret id, sealed bytes)` stored in
    /// the same transaction, so every replica can sign its deliveries.
    async fn create_webhook_sealed(
        &self,
        w: WebhookRecord,
        sub: SubscriptionDef,
        secrets: Vec<(String, Vec<u8>)>,
    ) -> StoreResult<()>;

    /// Readiness probe: runs a no-op job through the writer and waits for it (a read-only backend
    /// answers at once). `Ok` means writes are being accepted and committed now. Errors: `Busy` (queue
    /// full), `Unavailable` (writer stopped or dead). Callers bound the wait (`GET /ready`: 1 s).
    async fn ping_writer(&self) -> StoredResult;

    /// The backend's name and live connections (no I/O). Default: `"unknown"`, `None`.
    fn facts(&self) -> BackendFacts {
        BackendFacts {
            backend: "unknown",
            connections: None,
        }
    }

    /// Waits for all queued writes to commit, then stops accepting writes (graceful shutdown).
    async fn close(&self);

    /// Creates a subscription registered through the API with a caller-chosen id (a
    /// schedule's), with its `registration` change row; `None` when the id is taken (ids are never
    /// reused). Racing creates on one id give one winner.
    async fn register_new_subscription(
        &self,
        def: SubscriptionDef,
        now: i64,
    ) -> StoreResult<Option<SubscriptionRecord>>;
    /// Stores (or replaces) a `triggers.v2` service's manifest, keeping its heartbeat
    /// state.
    async fn register_service(
        &self,
        name: &str,
        version: &str,
        manifest: serde_json::Value,
        hash: &str,
        now: i64,
    ) -> StoreResult<ServiceRecord>;
    /// One registered service.
    async fn get_service(&self, name: &str) -> StoreResult<Option<ServiceRecord>>;
    /// Every registered service, by name.
    async fn list_services(&self) -> StoreResult<Vec<ServiceRecord>>;
    /// Records a heartbeat; false when the service is not registered.
    async fn service_heartbeat(
        &self,
        name: &str,
        started_at: &str,
        hash: &str,
        shutting_down: bool,
        now: i64,
    ) -> StoreResult<bool>;
    // --- ingress counts and quarantine ------------------------------------------------
    /// Adds each count's `n` to its row (a missing row starts at 0) in one transaction and returns the
    /// rows' new totals, in order: the sum over every replica. With `prune_before`, rows of earlier
    /// minutes are deleted in the same transaction.
    async fn add_ingress_counts(
        &self,
        counts: Vec<IngressCount>,
        prune_before: Option<i64>,
    ) -> StoreResult<Vec<u64>>;
    /// The rows `q` selects, newest minute first.
    async fn ingress_counts(&self, q: IngressCountQuery) -> StoreResult<Vec<IngressCount>>;
    /// The `admitted` rows of `minute` at every level but `source` (whose keys are unbounded), at most
    /// 10 000: what every replica together admitted so far, for the rate limits.
    async fn admitted_totals(&self, minute: i64) -> StoreResult<Vec<IngressCount>>;
    /// Quarantines a subscription (with its change row, so every replica refuses it). `Ok(false)` when
    /// it already was (the first record is kept).
    async fn quarantine_subscription(&self, q: QuarantineRecord) -> StoreResult<bool>;
    /// Releases a quarantined subscription (with its change row). `Ok(false)` when it was not.
    async fn release_subscription(&self, id: &str, now: i64) -> StoreResult<bool>;
    /// Every quarantined subscription, by id.
    async fn quarantines(&self) -> StoreResult<Vec<QuarantineRecord>>;
    /// Activity from `since` (ms) on, for the console's overview.
    async fn activity(&self, since: i64) -> StoreResult<Activity>;
    /// Appends an entry to the audit log after its head, hashed under `key` (the audit key; unkeyed
    /// without one) as [`tb_core::audit::append`] decides: after a break entry when rows lie past the
    /// head, which the head then counts. Concurrent appends take turns on the head row.
    async fn append_audit(
        &self,
        e: tb_core::audit::NewEntry,
        key: Option<tb_core::audit::Key>,
    ) -> StoreResult<tb_core::audit::Appended>;
    /// Audit entries matching `q` (see [`AuditQuery`]).
    async fn audit_entries(&self, q: AuditQuery) -> StoreResult<Vec<tb_core::audit::Entry>>;
    /// The audit log's head as recorded beside it (`(0, GENESIS)` when empty) and the largest `seq`
    /// stored, in one snapshot.
    async fn audit_head(&self) -> StoreResult<AuditHead>;
    /// Stores a console login, removing expired ones.
    async fn create_console_login(&self, login: ConsoleLogin) -> StoredResult;
    /// The unexpired console login whose token hashes to `token_sha256` at `now` (ms).
    async fn console_login(
        &self,
        token_sha256: &str,
        now: i64,
    ) -> StoreResult<Option<ConsoleLogin>>;
    /// Ends a console login; false when there was none.
    async fn delete_console_login(&self, token_sha256: &str) -> StoreResult<bool>;
    /// Ends every console login whose key (`name:sha256-hex`) is not in `keep`; returns how many.
    async fn prune_console_logins(&self, keep: Vec<String>) -> StoreResult<u64>;
    /// Every schedule cursor, ordered by subscription id.
    async fn schedule_cursors(&self) -> StoreResult<Vec<ScheduleCursorRecord>>;
    /// One schedule's cursor, `None` before its first pass.
    async fn schedule_cursor(&self, id: &str) -> StoreResult<Option<ScheduleCursorRecord>>;
    /// Compare-and-set of a schedule's cursor: `expected = None` creates it (version 1) unless it
    /// exists; `Some(v)` replaces it only at version `v`. Returns whether it wrote (`false`: another
    /// loop moved it first; re-read and re-plan).
    async fn put_schedule_cursor(
        &self,
        id: &str,
        cursor: tb_core::schedule::plan::Cursor,
        expected: Option<i64>,
        now: i64,
    ) -> StoreResult<bool>;
}
