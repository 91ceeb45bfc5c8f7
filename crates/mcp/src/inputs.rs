//! The tools' inputs: camelCase JSON, unknown fields refused; each struct's JSON schema (schemars)
//! is the tool's `inputSchema`, and its doc comments the fields' descriptions.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

/// `wait_for_signal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitForSignal {
    /// The session's run id (`run_...`).
    pub run_id: String,
    /// Signal name to wait for: 1-64 of a-z 0-9 _ . - (ignored when resuming with `waitId`).
    #[serde(default)]
    pub name: Option<String>,
    /// Resolve by timer after this many ms (1 .. 86400000); absent: no deadline.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Shown as the run's waitReason while it waits.
    #[serde(default)]
    pub reason: Option<String>,
    /// Seconds to block in this call (default 25, at most 55); still armed after it, the result
    /// carries `waitId`: call again with it to keep waiting.
    #[serde(default)]
    pub budget_s: Option<u64>,
    /// Resume an armed wait instead of arming a new one.
    #[serde(default)]
    pub wait_id: Option<String>,
}

/// `wait_for_any`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitForAny {
    /// The session's run id.
    pub run_id: String,
    /// 1 to 8 signal names raced together (ignored when resuming with `waitId`).
    #[serde(default)]
    pub names: Vec<String>,
    /// Resolve by timer after this many ms (1 .. 86400000); absent: no deadline.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Whether accepted user input takes part in the race (default true).
    #[serde(default)]
    pub user_input: Option<bool>,
    /// Shown as the run's waitReason while it waits.
    #[serde(default)]
    pub reason: Option<String>,
    /// Seconds to block in this call (default 25, at most 55).
    #[serde(default)]
    pub budget_s: Option<u64>,
    /// Resume an armed wait instead of arming a new one.
    #[serde(default)]
    pub wait_id: Option<String>,
}

/// `raise_signal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RaiseSignalArgs {
    /// Run id the signal goes to.
    pub run_id: String,
    /// Signal name: 1-64 of a-z 0-9 _ . -
    pub name: String,
    /// JSON data carried by the signal (inline up to 32 KiB).
    #[serde(default)]
    pub data: Option<Value>,
    /// Idempotency identity: raising the same id again is a recorded duplicate.
    #[serde(default)]
    pub signal_id: Option<String>,
    /// Also queue a turn so the session acts on it.
    #[serde(default)]
    pub wake: bool,
}

/// `list_signals`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListSignals {
    /// Run id.
    pub run_id: String,
    /// Signals per page (1 to 100, default 20; more is clamped: a page goes into the agent's context).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The previous page's `nextCursor`.
    #[serde(default)]
    pub before: Option<String>,
}

/// `claim_turn`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimTurn {
    /// Run id.
    pub run_id: String,
    /// Lease in ms (default 60000): ack before it lapses, or the turn is handed out again.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// Seconds to wait for a turn (default 10, at most 55).
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// `ack_turn`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AckTurn {
    /// Run id.
    pub run_id: String,
    /// The claimed turn's `turnId`.
    pub turn_id: String,
    /// The claimed turn's `claims` (which claim this ack is for).
    pub claim: u32,
}

/// `cancel_wait`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelWait {
    /// Run id.
    pub run_id: String,
    /// The armed wait's `waitId`.
    pub wait_id: String,
}

/// `receipt_show`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiptShow {
    /// Receipt id (`rcpt_...`).
    pub receipt_id: String,
}

/// `deliveries_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeliveriesList {
    /// `pending`, `retrying`, `delivered` or `dead-lettered`.
    #[serde(default)]
    pub state: Option<String>,
    /// Only this subscription's deliveries.
    #[serde(default)]
    pub subscription_id: Option<String>,
    /// Deliveries per page (1 to 500, default 50).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The previous page's `nextCursor`.
    #[serde(default)]
    pub before: Option<String>,
}

/// `dead_letters_replay`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeadLettersReplay {
    /// Subscription whose dead letters are replayed.
    pub subscription_id: String,
    /// Only those dead-lettered at or after this RFC 3339 time.
    #[serde(default)]
    pub from: Option<String>,
    /// Only those dead-lettered before this RFC 3339 time.
    #[serde(default)]
    pub to: Option<String>,
    /// Only those whose last attempt failed with this error class (http_500, connect, timeout, ...).
    #[serde(default)]
    pub error_class: Option<String>,
    /// false (default): preview only, nothing is replayed. true: replay, with `expect`.
    #[serde(default)]
    pub confirm: bool,
    /// With `confirm`: the preview's `count`; if the selection changed since, nothing is replayed.
    #[serde(default)]
    pub expect: Option<u64>,
}

/// `subscription_pause` / `subscription_resume`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionArgs {
    /// Trigger subscription id.
    pub subscription_id: String,
}
