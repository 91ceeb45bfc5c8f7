//! Sessions (signals-and-connectors §5): signals, waits, prompts and turns on a run. Request bodies are
//! closed objects (`deny_unknown_fields`); answers may grow fields, so they are read leniently.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use tb_core::signal::SessionSignalV1;

/// Body of `POST /v1/runs/{id}/signals`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RaiseSignal {
    /// `[a-z0-9_.-]{1,64}`.
    pub name: String,
    /// Inline up to 32 KiB; larger (up to 512 KiB) is stored by reference (`payloadRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Idempotency identity, `[A-Za-z0-9._:-]{1,128}`; minted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_id: Option<String>,
    /// Also enqueue a wake turn.
    #[serde(default)]
    pub wake: bool,
}

/// Answer of `POST /v1/runs/{id}/signals`: 202 `status: queued`, or 200 `status: duplicate` (the
/// `signalId` was seen before on this run; the first signal's fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SignalRaised {
    pub signal_id: String,
    pub name: String,
    pub raised_at: String,
    /// `queued` or `duplicate`.
    pub status: String,
    /// The wait that consumed it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed_by: Option<String>,
    /// Signal ids dropped to make room (overflow policy `drop_oldest`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// One signal in a run's mailbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SignalEntry {
    /// Arrival order in the mailbox, from 1.
    pub seq: u64,
    /// `buffered`, `consumed`, `dropped` or `expired`.
    pub state: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub signal: SessionSignalV1,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<String>,
}

/// `GET /v1/runs/{id}/signals`: one page, newest first. `buffered` counts every page; `nextCursor`
/// (a `seq`, for `before`) is present when the page is full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SignalPage {
    pub run_id: String,
    pub signals: Vec<SignalEntry>,
    pub buffered: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Body of `POST /v1/runs/{id}/waits`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArmWait {
    /// `signal` (wait_for_signal) or `any` (wait_for_any).
    pub kind: String,
    /// 1 to 8 signal names.
    pub names: Vec<String>,
    /// 1 .. 86 400 000 ms; absent waits without a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `any` only (default true): accepted user input takes part in the race.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_input: Option<bool>,
    /// Shown as the run's `waitReason` while it waits.
    pub reason: String,
}

/// Body of `POST /v1/runs/{id}/waits/{waitId}`: `{action: "cancel"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WaitAction {
    /// `cancel`.
    pub action: String,
}

/// What resolved a wait: `kind` is `stop`, `user_input`, `signal` or `timer` (that precedence).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Winner {
    pub kind: String,
    /// The consumed signal (`kind: signal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub signal: Option<SessionSignalV1>,
    /// The user-input turn (`kind: user_input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The deadline that fired (`kind: timer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

/// A wait: `GET /v1/runs/{id}/waits/{waitId}` and the answers of arming and cancelling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Wait {
    pub wait_id: String,
    pub run_id: String,
    /// `signal` or `any`.
    pub kind: String,
    pub names: Vec<String>,
    /// `armed`, `resolved` or `cancelled`.
    pub state: String,
    pub reason: String,
    /// User input interrupted it for one turn (it re-arms when that turn is acknowledged).
    pub interrupted: bool,
    /// The other candidates seen when it resolved: `[{kind, disposition}]`.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub losers: Vec<Value>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_input: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner: Option<Winner>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<String>,
}

impl Wait {
    /// Whether it is still waiting (`armed`).
    pub fn is_armed(&self) -> bool {
        self.state == "armed"
    }
}

/// `GET /v1/runs/{id}/waits`: every wait of the run, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WaitList {
    pub run_id: String,
    pub waits: Vec<Wait>,
}

/// Body of `POST /v1/runs/{id}/prompts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    /// The user's input, at most 32 KiB.
    pub text: String,
}

/// A turn: a unit of work handed to the run's driver. `content` is framed (`tb_core::turn`): a
/// server-written `system` line, and whatever came from outside under `untrusted`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Turn {
    pub turn_id: String,
    pub run_id: String,
    pub seq: u64,
    /// `start`, `prompt`, `signal` or `wait`.
    pub kind: String,
    /// `queued`, `leased`, `acked` or `expired`.
    pub state: String,
    /// Times claimed (more than 1: handed out again after a lapsed lease). An ack names it.
    pub claims: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub content: Value,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_at: Option<String>,
}

/// `GET /v1/runs/{id}/turns`: every turn of the run in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnList {
    pub run_id: String,
    pub turns: Vec<Turn>,
}
