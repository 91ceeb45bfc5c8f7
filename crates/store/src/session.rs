//! Records of sessions, signals, waits, turns and capability endpoints (DESIGN §4 Wait,
//! §5.8). Times are Unix milliseconds.

use serde::Serialize;
use serde_json::Value;
use tb_core::binding::OnExisting;
use tb_core::signal::{DataPlacement, SignalSource};
use tb_core::turn::{TurnKind, TurnState};
use tb_core::wait::{WaitSpec, WaitState};

use tb_core::run::RunStatus;

/// The run a delivered attempt starts (a session start carries one too, in [`Effect::StartSession`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub id: String,
    pub workflow_id: String,
    pub inputs: Value,
    /// `completed` (noop, or an http worker answering 200/201/204) or `running` (202); `failed` for a
    /// dead-lettered API run.
    pub status: RunStatus,
    /// Set when the run exhausted its start retries (RFC 0053): the log is `run.dead_lettered {runId,
    /// reason, attempts}` then `run.failed`, and the run stays fork-eligible for the retention period.
    pub dead_letter: Option<(String, u32)>,
    /// A session run: its workflow's session configuration (operator-set JSON; the start turn refers to
    /// it by `tb_core::turn::config_ref` and renders it with the run's inputs when read) and its
    /// mailbox policy.
    pub session: Option<(Value, tb_core::signal::MailboxPolicy)>,
}

/// A signal to raise. The server stamps `source` and the time; `signal_id` is the idempotency identity.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSignal {
    pub signal_id: String,
    pub name: String,
    pub source: SignalSource,
    pub data: DataPlacement,
    pub wake: bool,
    /// The webhook delivery that raised it, so its receipt settles when the signal is consumed.
    pub delivery_id: Option<String>,
}

/// A prompt to enqueue as user input.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPrompt {
    /// Server-owned text (a template or the API caller's prompt).
    pub text: String,
    /// Values the text refers to, kept apart from it (untrusted).
    pub variables: Value,
    /// Who it came from, for the turn's system line (e.g. `binding pr-session`, `api`).
    pub from: String,
    pub delivery_id: Option<String>,
}

/// Where a webhook action lands.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// A fixed run.
    Run(String),
    /// The live session of a workflow holding a coalesce key.
    Session { workflow_id: String, key: String },
}

/// A local action a delivery performs inside its attempt's transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Start a session run. With `coalesce`, the first delivery for the key starts it and later ones take
    /// `on_existing` on the live session holding the key.
    StartSession {
        run: NewRun,
        coalesce: Option<Box<Coalesce>>,
    },
    RaiseSignal {
        target: Target,
        signal: NewSignal,
    },
    EnqueuePrompt {
        target: Target,
        prompt: NewPrompt,
    },
}

/// Coalescing of a `start_run` delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct Coalesce {
    pub workflow_id: String,
    pub key: String,
    pub on_existing: OnExisting,
    /// For `on_existing = signal`.
    pub signal: Option<NewSignal>,
    /// For `on_existing = prompt`.
    pub prompt: Option<NewPrompt>,
}

/// What raising a signal did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RaiseOutcome {
    /// `queued`, or `duplicate` when the `signalId` was seen before on this run.
    pub status: &'static str,
    /// The `SessionSignalV1` envelope (the first one, for a duplicate).
    pub signal: Value,
    /// The wait that consumed it at once, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumed_by: Option<String>,
    /// Signal ids dropped to make room (`drop_oldest`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// One page of a run's mailbox (`Store::list_signals`): newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalPage {
    /// At most the asked `limit` signals, by `seq` descending.
    pub signals: Vec<SignalRecord>,
    /// How many of the run's signals are buffered now (all pages).
    pub buffered: u64,
}

/// One signal in a run's mailbox.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalRecord {
    pub run_id: String,
    /// Arrival order in the mailbox, from 1.
    pub seq: u64,
    /// `buffered`, `consumed` or `dropped`.
    pub state: String,
    pub signal: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumed_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<i64>,
}

/// A stored wait.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitRecord {
    pub id: String,
    pub run_id: String,
    pub spec: WaitSpec,
    /// Absolute deadline (ms), if any.
    pub deadline: Option<i64>,
    pub state: WaitState,
    /// The user-input turn that interrupted it, while interrupted.
    pub interrupted_by: Option<String>,
    /// `{kind, signal?, turnId?, deadline?}` once resolved.
    pub winner: Option<Value>,
    /// `[{kind, disposition}]` of the losing candidates.
    pub losers: Value,
    pub created_at: i64,
    pub settled_at: Option<i64>,
}

/// A turn on a run's queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRecord {
    pub id: String,
    pub run_id: String,
    pub seq: u64,
    pub kind: TurnKind,
    /// Framed content (`tb_core::turn`).
    pub content: Value,
    pub state: TurnState,
    pub lease_until: Option<i64>,
    /// How many times it was claimed (more than 1 = redelivered after a lapsed lease).
    pub claims: u32,
    pub created_at: i64,
    pub acked_at: Option<i64>,
}

/// A minted capability endpoint (signals-and-connectors §4.1). The token itself is never stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityRecord {
    pub id: String,
    pub run_id: String,
    pub signal: String,
    pub label: Option<String>,
    pub wake: bool,
    /// Secret file name when requests must carry `X-Signature-256`.
    #[serde(skip)]
    pub hmac_file: Option<String>,
    pub hmac: bool,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
    pub max_uses: u64,
    pub use_count: u64,
    pub revoked_at: Option<i64>,
}
