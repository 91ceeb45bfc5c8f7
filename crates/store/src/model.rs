//! Records the Store reads and writes. Times are Unix milliseconds; JSON columns are `serde_json::Value`.

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use tb_core::delivery::{AttemptOutcome, DeliveryKind, DeliveryState};
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::run::RunStatus;
use tb_core::subscription::{Source, SubscriptionState, Transition};

/// A trigger subscription as stored: identity, configuration (no secrets) and state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriptionRecord {
    pub id: String,
    pub source: Source,
    /// Connector name (`github`, `standard-webhooks`, `hmac`).
    pub connector: String,
    /// Connector spec, retry policy and limits as JSON; never a secret.
    pub config: Value,
    pub state: SubscriptionState,
    /// Consecutive failed attempts that trip `active -> failed`; 0 never trips.
    pub failure_threshold: u32,
    /// Failed attempts since the last success (the failure streak).
    pub consecutive_failures: u32,
    pub last_success_at: Option<i64>,
    /// Start of the first failed attempt of the current streak (Unix ms); `None` without a streak.
    pub first_failure_at: Option<i64>,
    /// When the current state was entered (Unix ms); the creation time when it never changed.
    pub state_since: i64,
    /// The last failed attempt's `"<error class>: <message>"` (sanitized, content-free), if any.
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Definition of a subscription to create or update (state is kept on update).
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionDef {
    pub id: String,
    pub source: Source,
    pub connector: String,
    pub config: Value,
    /// Consecutive failed attempts that trip `active -> failed`; 0 never trips.
    pub failure_threshold: u32,
}

/// A new delivery written with its receipt.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDelivery {
    pub id: String,
    /// What the delivery is for (`deliveries.kind`): `binding` for a routed event, `api_run`,
    /// `capability_signal`; the worker dispatches on it.
    pub kind: DeliveryKind,
    pub binding_id: String,
    /// `start_run`.
    pub action: String,
    pub workflow_id: Option<String>,
    /// Pre-assigned id of the run this delivery starts, so the sender's answer can name it.
    pub run_id: Option<String>,
    pub inputs: Value,
    /// Rendered action parameters (`ActionParams` JSON), if any.
    pub params: Option<Value>,
    /// `pending`, or `dead-lettered` when the subscription is dead-lettered.
    pub state: DeliveryState,
    pub dead_letter_reason: Option<String>,
}

/// A receipt to commit with its body and deliveries in one transaction (DESIGN §5.1).
#[derive(Debug, Clone)]
pub struct NewReceipt {
    pub id: String,
    /// The edge it came through (`receipts.source`: `webhook`, `capability`, `api`, `schedule`, ...).
    pub source: ReceiptSource,
    pub subscription_id: String,
    pub dedup_key: String,
    pub provider_event_id: String,
    pub event_type: String,
    pub normalized: Value,
    /// What ingest writes: `routed` (deliveries created), `unmatched` (no binding matched),
    /// `dead_lettered` (its subscription is dead-lettered), `routing_failed` (every matching binding
    /// failed to render), or a content-free refusal record (`rejected`, `rate_limited`).
    pub state: ReceiptState,
    pub content_type: Option<String>,
    /// The exact request bytes; stored unchanged.
    pub body: Bytes,
    pub received_at: i64,
    /// End of the dedup window (ms): until then the dedup key answers `Duplicate`.
    pub dedup_until: i64,
    pub deliveries: Vec<NewDelivery>,
    /// A capability endpoint whose use this receipt counts; the commit is refused (`Rejected(not_found)`)
    /// if the endpoint was revoked, expired or used up meanwhile.
    pub capability: Option<String>,
    /// The W3C `traceparent` of the span that received it, written on each of its deliveries
    /// ([`DeliveryRecord::trace_context`]); `None` when nothing traced it.
    pub trace_context: Option<String>,
    /// Hand-off at commit: lease up to `limit` of the `pending` deliveries to the local
    /// worker in the same transaction, returned in [`IngestOutcome::Accepted::leased`]. `None` (role
    /// `api`, no worker, or no free slot) writes them unleased and due at once, as before.
    pub lease: Option<LeaseRequest>,
}

/// A lease to write at commit on a receipt's new `pending` deliveries ([`NewReceipt::lease`]): one grant
/// of `tb_core::lease::grant(received_at, lease_ms)` (a fresh token; `lease_until = due_at =
/// received_at + lease_ms`), owned by `owner`. A crash before the attempt commits leaves the lease to
/// lapse, and any worker's `lease_due` then takes the delivery with a new token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The local worker's id (`deliveries.lease_owner`, for display).
    pub owner: String,
    /// Lease length, ms.
    pub lease_ms: u64,
    /// At most this many deliveries are leased (the worker's reserved free slots); the rest stay due.
    pub limit: u32,
}

/// Summary of one delivery in an ingest answer. `run_id` is absent for a dead-lettered delivery: its run
/// was never started.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryRef {
    pub delivery_id: String,
    pub binding_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// What committing a receipt gave.
#[derive(Debug, Clone, PartialEq)]
pub enum IngestOutcome {
    /// Newly committed.
    Accepted {
        receipt_id: String,
        deliveries: Vec<DeliveryRef>,
        /// The deliveries leased at commit ([`NewReceipt::lease`]), in delivery order; empty without a
        /// request. The caller hands them to its worker, which attempts them without a lease
        /// transaction.
        leased: Vec<Lease>,
    },
    /// The dedup key was already taken: the first receipt and its deliveries.
    Duplicate {
        receipt_id: String,
        deliveries: Vec<DeliveryRef>,
    },
}

/// A stored receipt (without its body).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReceiptRecord {
    pub id: String,
    /// The edge it came through (`receipts.source`).
    pub source: ReceiptSource,
    pub subscription_id: String,
    pub dedup_key: String,
    pub provider_event_id: String,
    pub event_type: String,
    pub normalized: Value,
    pub state: ReceiptState,
    pub content_type: Option<String>,
    pub body_bytes: u64,
    pub received_at: i64,
    pub updated_at: i64,
    /// Repeated deliveries of its dedup key answered `duplicate` (counted, not stored).
    pub duplicates: u64,
    pub last_duplicate_at: Option<i64>,
}

/// A stored delivery.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryRecord {
    pub id: String,
    /// What the delivery is for (`deliveries.kind`). For `outbound_webhook`, `receipt_id` is the run
    /// event's id and `subscription_id` / `binding_id` the webhook's id.
    pub kind: DeliveryKind,
    pub receipt_id: String,
    pub subscription_id: String,
    pub binding_id: String,
    pub dedup_key: String,
    pub action: String,
    pub workflow_id: Option<String>,
    pub run_id: Option<String>,
    pub inputs: Value,
    pub state: DeliveryState,
    pub attempts: u32,
    /// Operator replays so far; each grants one attempt beyond the retry policy's `max_attempts`.
    pub replays: u32,
    pub due_at: Option<i64>,
    pub lease_until: Option<i64>,
    /// The worker holding the lease (`worker-att_...`) while `lease_until` is set.
    pub lease_owner: Option<String>,
    pub first_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub dead_letter_reason: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Rendered action parameters (`tb_core::binding::ActionParams` as JSON), when the action has any.
    pub params: Option<Value>,
    /// When its effect was consumed (run started; signal or prompt taken by a wait or acked turn).
    pub consumed_at: Option<i64>,
    /// The W3C `traceparent` of the ingress span that committed its receipt (`deliveries.trace_context`):
    /// each attempt's span links to it. `None` for outbound webhook deliveries and for
    /// deliveries written before it was kept.
    pub trace_context: Option<String>,
}

/// A delivery leased to a worker until `lease_until` (`Store::lease_due`).
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// The delivery as it was leased (`attempts` is the number of attempts recorded before this one).
    pub delivery: DeliveryRecord,
    /// Who holds it, for display only (`deliveries.lease_owner`: the worker's id, e.g. `worker-att_...`).
    /// It fences nothing: two grants to the same owner carry different tokens.
    pub owner: String,
    /// Fencing token of this grant, `lse_<32 hex>` (`tb_core::lease::grant`): renewal, release and the
    /// attempt's commit must present it, and are refused with [`crate::StoreError::LeaseLost`] once the
    /// delivery was granted again.
    pub token: String,
    /// Lease end, Unix ms (the caller's clock, as passed to `lease_due`).
    pub lease_until: i64,
    /// The lease length granted, in ms (what a heartbeat extends by).
    pub lease_ms: u64,
    /// The attempt this grant took over: an earlier grant on the delivery lapsed with no outcome
    /// recorded, and its attempt (this number) was recorded `lost` in the grant's transaction
    /// (`tb_core::lease::take_over`). `delivery.attempts` already counts it. `None` otherwise.
    pub lost: Option<u32>,
}

/// One recorded attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub delivery_id: String,
    pub attempt: u32,
    /// Id of this attempt's `trigger.delivery.attempted` event (the started run's `causationId`).
    pub event_id: String,
    pub outcome: AttemptOutcome,
    pub error_class: Option<String>,
    /// Short sanitized message of a failed attempt: `HTTP 500: <first bytes of the body, printable
    /// only, at most 256 bytes>`, or a plain sentence for connect / timeout errors. Never a header
    /// value or a secret.
    pub message: Option<String>,
    pub started_at: i64,
    pub duration_ms: u64,
    pub next_due_at: Option<i64>,
}

/// One attempt to record, in one transaction. The store loads the delivery (locked), the run a local
/// effect acts on (through the session code), the receipt (locked) with its other deliveries and, only
/// when the rule needs to write it, the subscription (locked), and writes what
/// `tb_core::attempt::after_attempt` decides from them and `report`: the attempt row, the delivery's next
/// state and due time, the `trigger.delivery.attempted` event, the run it starts, the receipt's settled
/// state and the subscription's streak and state.
///
/// Errors: [`crate::StoreError::LeaseLost`] when `report.lease` no longer holds the delivery (another
/// grant's token, a terminal delivery, an attempt number already recorded, or a lost fenced update);
/// [`crate::StoreError::Rejected`] when `effect` is refused (nothing is written).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptCommit {
    pub delivery_id: String,
    /// The worker's account of the attempt: lease token and attempt number, event id, decision,
    /// failure, timing (Unix ms / ms), the run it starts and the failure policy. Its `effect` is left
    /// `None`: the store fills it from [`AttemptCommit::effect`] inside the transaction.
    pub report: tb_core::attempt::AttemptReport,
    /// A local action performed in the same transaction (session start with coalescing, signal, prompt).
    /// If it cannot be done the whole commit is refused with [`crate::StoreError::Rejected`] and nothing
    /// is written; the worker then records a failed attempt.
    pub effect: Option<crate::session::Effect>,
    /// Unix ms (the caller's clock): `updated_at`, a retry's due time (`now + delay_ms`), event
    /// timestamps, `consumed_at`, `last_success_at`.
    pub now: i64,
}

/// What an attempt commit changed beyond the attempt itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttemptCommitted {
    pub subscription_transition: Option<Transition>,
    /// The run the delivery started or targeted.
    pub run_id: Option<String>,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRecord {
    pub id: String,
    pub workflow_id: String,
    pub status: RunStatus,
    pub inputs: Value,
    pub output: Option<Value>,
    pub delivery_id: Option<String>,
    pub receipt_id: Option<String>,
    pub subscription_id: Option<String>,
    pub causation_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Why the run is `waiting-external` (the armed wait's reason).
    pub wait_reason: Option<String>,
}

/// One event in a run's log (`sequence` from 0).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEventRecord {
    pub run_id: String,
    pub sequence: u64,
    pub event_id: String,
    pub event_type: String,
    pub payload: Value,
    pub causation_id: Option<String>,
    pub timestamp: i64,
}

/// One run-less trigger event (`trigger.delivery.attempted`, `trigger.subscription.state.changed`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriptionEventRecord {
    pub event_id: String,
    pub subscription_id: String,
    pub event_type: String,
    pub payload: Value,
    pub delivery_id: Option<String>,
    pub timestamp: i64,
}

/// Filter and page for list queries: newest first, `before` is an exclusive id cursor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListQuery {
    pub limit: u32,
    pub before: Option<String>,
    pub state: Option<String>,
    pub subscription_id: Option<String>,
    /// Only ids at or after this one (ids are time-ordered: a time range is an id range).
    pub from_id: Option<String>,
    /// Receipts only: the provider's delivery id (`X-GitHub-Delivery`, `webhook-id` ...).
    pub provider_event_id: Option<String>,
    /// Runs only: the workflow.
    pub workflow_id: Option<String>,
}

/// Counts for metrics and health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct QueueDepth {
    pub pending: u64,
    pub retrying: u64,
    pub dead_lettered: u64,
}

/// Page request of [`crate::Store::dead_letters`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterQuery {
    pub subscription_id: String,
    pub limit: u32,
    /// Continue after this `(dead_lettered_at, delivery_id)` (exclusive); `None` for the first page.
    pub before: Option<(i64, String)>,
    /// Oldest `dead_lettered_at` still kept (ms): now minus the retention.
    pub not_before: i64,
}

/// Selection of a bulk dead-letter replay (`tb_core::replay::ReplayFilter` resolved to ms).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterSelect {
    pub subscription_id: String,
    /// Dead-lettered at or after this (Unix ms), if set.
    pub from: Option<i64>,
    /// Dead-lettered before this (Unix ms, exclusive), if set.
    pub to: Option<i64>,
    /// Exact error class of the last (dead-lettering) attempt, if set.
    pub error_class: Option<String>,
    /// Oldest dead-lettering time still kept (ms): now minus the retention.
    pub not_before: i64,
    /// Most delivery ids to return.
    pub limit: u32,
}

/// What a [`DeadLetterSelect`] selects, read in one statement (one snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeadLetterSelection {
    /// Every matching dead letter (not capped by `limit`).
    pub count: u64,
    /// The first `limit` matching delivery ids, oldest dead-lettering first.
    pub delivery_ids: Vec<String>,
}

/// One dead-lettered delivery with its last attempt (RFC 0232 record, content-free).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterRecord {
    pub delivery_id: String,
    pub subscription_id: String,
    pub dedup_key: String,
    /// Number of the dead-lettered attempt.
    pub attempt: u32,
    /// Its `trigger.delivery.attempted` event id.
    pub attempt_event_id: String,
    /// `retries_exhausted`, `subscription_dead_lettered`, `workflow_missing`, ...
    pub reason: Option<String>,
    pub dead_lettered_at: i64,
    /// The `trigger.subscription.state.changed` payload this dead-lettering caused, if any.
    pub state_change: Option<Value>,
}

/// Unix ms -> RFC 3339 UTC with milliseconds (`2026-11-30T01:22:15.056Z`): the one time format of the
/// API, the event log and stored envelopes.
pub fn rfc3339(ms: i64) -> String {
    use chrono::{SecondsFormat, TimeZone, Utc};
    Utc.timestamp_millis_opt(ms)
        .single()
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A stored final HTTP answer for idempotent replay.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredReply {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

/// Outcome of [`crate::Store::idempotency_claim`].
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyClaim {
    /// This request holds the claim until `lease_until` (ms since the epoch); that value fences
    /// [`crate::Store::idempotency_release`], since a takeover after the lease always sets a later one.
    New {
        lease_until: i64,
    },
    InFlight {
        retry_after_ms: u64,
    },
    Mismatch,
    Replay(StoredReply),
}

/// What one retention sweep removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SweepCounts {
    /// Raw bodies of settled receipts older than the body retention.
    pub bodies: u64,
    /// Dead-lettered deliveries (and their attempts) older than the dead-letter retention.
    pub dead_letters: u64,
    /// Expired idempotency records.
    pub idempotency: u64,
    /// Settled signal records (consumed, dropped, expired) older than the body retention.
    pub signals: u64,
}

/// Where a retention pass resumes. A pass starts from `SweepCursor::default()` and
/// passes each [`SweepPage::next`] back to [`crate::Store::sweep`] until it is `None`. Bodies and dead
/// letters are walked in key order (receipt id, delivery id), so every row is examined once per pass
/// whether or not it is deleted: rows that stay (unsettled receipts, bodies already gone) never stall it.
/// The body walk ends at the first body not yet past the retention (`tb_core::retention::body_walk_ends`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepCursor {
    /// Receipt id of the last body examined; `None` = from the first.
    pub bodies_after: Option<String>,
    /// Every body was examined.
    pub bodies_done: bool,
    /// Id of the last dead-lettered delivery examined; `None` = from the first.
    pub dead_letters_after: Option<String>,
    /// Every dead-lettered delivery was examined.
    pub dead_letters_done: bool,
    /// No expired idempotency record is left.
    pub idempotency_done: bool,
    /// No settled signal record past the body retention is left.
    pub signals_done: bool,
}

/// One batch of a retention pass: what it removed and where the pass goes on (`None` = pass complete).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SweepPage {
    pub counts: SweepCounts,
    pub next: Option<SweepCursor>,
}

/// An outbound webhook registration. Each run event whose type is in `events` becomes one `webhook`
/// delivery (in the same transaction as the event), retried and dead-lettered like any delivery.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WebhookRecord {
    pub id: String,
    pub url: String,
    /// Run event types (`run.completed`, ...) or `*`.
    pub events: Vec<String>,
    pub tenant_id: String,
    /// File name of the signing secret under the secrets directory.
    pub secret_file: String,
    /// RFC 0201: file name of the `whsec_` key when the webhook also gets Standard Webhooks headers.
    pub standard_secret_file: Option<String>,
    pub created_at: i64,
}

/// A schedule subscription's cursor as stored (`schedule_cursors`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleCursorRecord {
    pub subscription_id: String,
    /// The planner's state (`tb_core::schedule::plan::Cursor`).
    pub cursor: tb_core::schedule::plan::Cursor,
    /// Compare-and-set version: 1 when created, +1 on every write.
    pub version: i64,
    /// When it was last written (Unix ms).
    pub updated_at: i64,
}

/// A registered `triggers.v2` service (`services`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceRecord {
    pub name: String,
    pub service_version: String,
    /// The manifest as registered (JSON).
    pub manifest: Value,
    /// `sha256:...` of the manifest's hash input.
    pub manifest_hash: String,
    /// When it (last) registered, Unix ms.
    pub registered_at: i64,
    /// When its last heartbeat arrived, Unix ms.
    pub last_heartbeat_at: Option<i64>,
    /// The `started_at` of the replica that sent the last heartbeat (RFC 3339).
    pub started_at: Option<String>,
    /// The `manifest_hash` that heartbeat carried (differs from `manifest_hash`: another build).
    pub heartbeat_hash: Option<String>,
    pub shutting_down: bool,
    /// Its replicas heard from in the last hour, by `started_at`.
    pub replicas: Vec<ReplicaRecord>,
}

/// One replica of a service, told apart by its process start (`started_at`, RFC 3339).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaRecord {
    pub started_at: String,
    /// The `manifest_hash` its last heartbeat carried.
    pub manifest_hash: String,
    /// When its last heartbeat arrived, Unix ms.
    pub last_heartbeat_at: i64,
    pub shutting_down: bool,
}

/// A query of the audit log. Empty filters match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Oldest first, after this `seq` (exclusive); the default order.
    pub after_seq: Option<i64>,
    /// Newest first, before this `seq` (exclusive); used when `newest_first`.
    pub before_seq: Option<i64>,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
    /// Only this actor (an API key's name).
    pub actor: Option<String>,
    /// Only this action, or actions under it (`dead_letters` matches `dead_letters.replay`).
    pub action: Option<String>,
    /// Only this target.
    pub target: Option<String>,
    /// From this time on (ms since the epoch, inclusive).
    pub from: Option<i64>,
    /// Up to this time (ms, inclusive).
    pub to: Option<i64>,
    /// At most this many entries (1..=1000).
    pub limit: u32,
}

/// The audit log's head and the largest `seq` stored, read in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditHead {
    /// The newest entry's `seq` as the store recorded it (0 when empty).
    pub seq: i64,
    /// Its hash (`tb_core::audit::GENESIS` when empty).
    pub hash: String,
    /// The largest `seq` in the log (0 when empty); more than `seq` only if rows were added by hand.
    pub max_seq: i64,
    /// How many appends found rows past the head and stepped over them with an `audit.break` entry.
    pub breaks: i64,
    /// The `seq` of the newest such entry (0 when none).
    pub last_break_seq: i64,
    /// Rows stored with `seq` below 1 (0 or negative): never written by a server, whose entries start
    /// at 1 (`tb_core::audit::bounds`).
    pub below_one: i64,
}

/// A console login: the cookie's token is kept only as its SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleLogin {
    /// SHA-256 of the cookie's token, lowercase hex.
    pub token_sha256: String,
    /// The name of the API key that logged in (its scopes are looked up on every request).
    pub key_name: String,
    /// The SHA-256 (hex) of that key: a key rotated under the same name ends its logins.
    pub key_sha256: String,
    /// The login's CSRF token (random, hex), sent back in every mutating form.
    pub csrf: String,
    /// When the login was made (ms).
    pub created_at: i64,
    /// When it ends (ms).
    pub expires_at: i64,
}

/// Activity of a time window, for the console's overview: counts per subscription and
/// minute, and the state of the queue now.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Activity {
    /// `(subscription, receipt state, minute index from the window start, count)`.
    pub receipts: Vec<(String, String, i64, u64)>,
    /// `(subscription, attempt outcome, minute index, count)`.
    pub attempts: Vec<(String, String, i64, u64)>,
    /// Deliveries now in `pending`, `retrying` and `dead-lettered`.
    pub queue: QueueDepth,
    /// `created_at` (ms) of the oldest delivery still `pending` or `retrying`.
    pub oldest_undelivered_at: Option<i64>,
    /// Waits armed now, and the nearest deadline (ms).
    pub waits_armed: u64,
    pub next_deadline: Option<i64>,
}

/// One row of `ingress_counts`: requests with one outcome at one level in one UTC minute,
/// summed over every replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressCount {
    /// The UTC minute: Unix ms / 60 000 ([`tb_core::rate::minute_of`]).
    pub minute: i64,
    /// `global`, `source`, `subscription` or `binding` ([`tb_core::rate::Scope`]).
    pub scope: String,
    /// The subscription or binding id, source key, or `""` for `global`.
    pub key: String,
    /// `admitted` (what rate limits count), or a refusal: `rate_limited`, `signature_invalid`,
    /// `too_large`, `headers_too_large`, `not_found`, `quarantined`, ...
    pub outcome: String,
    /// Requests.
    pub n: u64,
}

/// Which [`IngressCount`] rows to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngressCountQuery {
    /// Rows of this minute and later.
    pub since_minute: i64,
    /// Only this scope.
    pub scope: Option<String>,
    /// Only this key.
    pub key: Option<String>,
    /// At most this many rows, newest minute first (capped at 10 000).
    pub limit: u32,
}

/// A quarantined subscription: it refuses every request with 403
/// `subscription_quarantined` until an operator releases it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRecord {
    pub subscription_id: String,
    /// When it was quarantined (Unix ms).
    pub since: i64,
    /// Why: the operator's words, or the automatic rule's ([`tb_core::quarantine::QuarantinePolicy::reason`]).
    pub reason: String,
    /// The operator's key id; `None` for the automatic rule.
    pub quarantined_by: Option<String>,
}
