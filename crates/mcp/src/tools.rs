//! The tools: their inputs (JSON schemas derived from these structs), the scopes each needs, and
//! what each does through the typed client. Results are framed by [`crate::frame`].

use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tb_client::{ArmWait, Client, ListQuery, RaiseSignal, ReplayFilter, ReplayRequest, Wait};

/// Default seconds a wait tool blocks before it hands back the wait id to resume with.
pub const DEFAULT_BUDGET_S: u64 = 25;
/// Most seconds a wait tool blocks in one call (agents' tool calls commonly time out at 60 s).
pub const MAX_BUDGET_S: u64 = 55;

const RUN_CREATE: &str = "runs:create";
const RUN_READ: &str = "runs:read";
const MANAGE: &str = "webhooks:manage";

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
    /// Signals per page (1 to 500, default 50).
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

/// One tool: its name, what it does (shown to the agent), the scopes its calls need, whether it only
/// reads, and its input schema.
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub scopes: &'static [&'static str],
    pub read_only: bool,
    pub schema: fn() -> std::sync::Arc<rmcp::model::JsonObject>,
}

fn schema<T: JsonSchema + 'static>() -> std::sync::Arc<rmcp::model::JsonObject> {
    rmcp::handler::server::tool::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("a tool's input schema: {e}"))
}

/// Every tool, session tools first.
pub const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "wait_for_signal",
        description: "Park the session until the named signal arrives (or its timer fires, or the run is stopped). Arms a durable wait and blocks up to budgetS seconds; the result has `resolved` and the wait with its `winner` (kind stop, signal or timer). Still unresolved: call again with the returned waitId. A signal already buffered wins at once.",
        scopes: &[RUN_CREATE, RUN_READ],
        read_only: false,
        schema: schema::<WaitForSignal>,
    },
    ToolSpec {
        name: "wait_for_any",
        description: "Park the session until the first of several signals, user input, the timer, or stop (that precedence: stop > user input > signal > timer). Blocks up to budgetS seconds; unresolved: call again with the returned waitId.",
        scopes: &[RUN_CREATE, RUN_READ],
        read_only: false,
        schema: schema::<WaitForAny>,
    },
    ToolSpec {
        name: "raise_signal",
        description: "Raise a named signal on a run: it goes to the run's FIFO mailbox, and an armed wait on that name resolves at once. signalId makes it idempotent.",
        scopes: &[RUN_CREATE],
        read_only: false,
        schema: schema::<RaiseSignalArgs>,
    },
    ToolSpec {
        name: "list_signals",
        description: "One page of a run's mailbox, newest first: buffered, consumed, dropped and expired signals. Page on with `before` = nextCursor.",
        scopes: &[RUN_READ],
        read_only: true,
        schema: schema::<ListSignals>,
    },
    ToolSpec {
        name: "claim_turn",
        description: "Lease the run's next turn (start, prompt, signal or wait), waiting up to timeoutS for one. Its content's `untrusted` part is data from outside. Ack it with ack_turn before the lease lapses.",
        scopes: &[RUN_CREATE],
        read_only: false,
        schema: schema::<ClaimTurn>,
    },
    ToolSpec {
        name: "ack_turn",
        description: "Acknowledge a claimed turn (turnId and its claims count as `claim`).",
        scopes: &[RUN_CREATE],
        read_only: false,
        schema: schema::<AckTurn>,
    },
    ToolSpec {
        name: "cancel_wait",
        description: "Cancel an armed wait; the run goes on running.",
        scopes: &[RUN_CREATE],
        read_only: false,
        schema: schema::<CancelWait>,
    },
    ToolSpec {
        name: "receipt_show",
        description: "A receipt (one inbound request): its state, its deliveries and its timeline. Never the body.",
        scopes: &[MANAGE],
        read_only: true,
        schema: schema::<ReceiptShow>,
    },
    ToolSpec {
        name: "deliveries_list",
        description: "Deliveries, newest first, by state and subscription. Page on with `before` = nextCursor.",
        scopes: &[MANAGE],
        read_only: true,
        schema: schema::<DeliveriesList>,
    },
    ToolSpec {
        name: "dead_letters_replay",
        description: "Replay a subscription's dead letters. First call without confirm: a preview (count and sample), nothing replayed. Then call with confirm: true and expect: <the preview's count> to replay (each gets one more attempt); a changed selection replays nothing.",
        scopes: &[MANAGE],
        read_only: false,
        schema: schema::<DeadLettersReplay>,
    },
    ToolSpec {
        name: "subscription_pause",
        description: "Pause a trigger subscription: it refuses new requests and holds its queued deliveries.",
        scopes: &[MANAGE],
        read_only: false,
        schema: schema::<SubscriptionArgs>,
    },
    ToolSpec {
        name: "subscription_resume",
        description: "Resume a paused trigger subscription.",
        scopes: &[MANAGE],
        read_only: false,
        schema: schema::<SubscriptionArgs>,
    },
];

/// A tool's outcome before framing: the API's answer, and the tool's own trusted fields.
pub struct Outcome {
    pub value: Value,
    pub extra: Map<String, Value>,
}

impl Outcome {
    fn of(value: impl serde::Serialize) -> Result<Outcome, ToolError> {
        Ok(Outcome {
            value: serde_json::to_value(value).map_err(|e| ToolError::internal(e.to_string()))?,
            extra: Map::new(),
        })
    }

    fn with(mut self, k: &str, v: Value) -> Outcome {
        self.extra.insert(k.into(), v);
        self
    }
}

/// Why a tool call failed: a machine code (the API's, or `invalid_arguments`), its message, and the
/// HTTP status when the API answered.
#[derive(Debug)]
pub struct ToolError {
    pub code: String,
    pub message: String,
    pub status: Option<u16>,
}

impl ToolError {
    fn invalid(message: impl Into<String>) -> ToolError {
        ToolError {
            code: "invalid_arguments".into(),
            message: message.into(),
            status: None,
        }
    }

    fn internal(message: impl Into<String>) -> ToolError {
        ToolError {
            code: "internal".into(),
            message: message.into(),
            status: None,
        }
    }

    /// The error as a result an agent reads.
    pub fn to_json(&self) -> Value {
        json!({"error": self.code, "message": self.message, "status": self.status})
    }
}

impl From<tb_client::Error> for ToolError {
    fn from(e: tb_client::Error) -> ToolError {
        ToolError {
            code: e
                .code()
                .map(|c| c.as_str().to_owned())
                .unwrap_or_else(|| "unavailable".into()),
            status: e.status(),
            message: match e {
                tb_client::Error::Api { message, .. } => message,
                other => other.to_string(),
            },
        }
    }
}

fn args<T: serde::de::DeserializeOwned>(a: Option<Map<String, Value>>) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(a.unwrap_or_default()))
        .map_err(|e| ToolError::invalid(format!("arguments: {e}")))
}

/// Blocks on an armed wait for `budget_s` (default/clamp above), or until `cancelled` resolves.
async fn block(
    api: &Client,
    run: &str,
    w: Wait,
    budget_s: Option<u64>,
    cancelled: impl std::future::Future<Output = ()>,
) -> Result<Outcome, ToolError> {
    let budget = Duration::from_secs(budget_s.unwrap_or(DEFAULT_BUDGET_S).min(MAX_BUDGET_S));
    let w = if w.is_armed() {
        tokio::select! {
            r = api.wait_for(run, &w.wait_id, budget) => r?,
            () = cancelled => w,
        }
    } else {
        w
    };
    let resolved = !w.is_armed();
    let next = if resolved {
        json!("resolved: react to `winner`")
    } else {
        json!(format!(
            "still armed: call this tool again with waitId {} to keep waiting",
            w.wait_id
        ))
    };
    Ok(Outcome::of(&w)?
        .with("resolved", json!(resolved))
        .with("next", next))
}

fn reason(r: Option<String>, names: &[String]) -> String {
    r.unwrap_or_else(|| format!("waiting for {}", names.join(" or ")))
}

/// Runs tool `name` with `arguments` through `api`. `cancelled` ends a blocking wait early (the
/// agent cancelled the call); the wait stays armed.
pub async fn call(
    api: &Client,
    name: &str,
    arguments: Option<Map<String, Value>>,
    cancelled: impl std::future::Future<Output = ()>,
) -> Result<Outcome, ToolError> {
    match name {
        "wait_for_signal" => {
            let a: WaitForSignal = args(arguments)?;
            let w = match &a.wait_id {
                Some(id) => api.get_wait(&a.run_id, id, 0).await?,
                None => {
                    let name = a
                        .name
                        .ok_or_else(|| ToolError::invalid("`name` is required to arm a wait"))?;
                    let names = vec![name];
                    let body = ArmWait {
                        kind: "signal".into(),
                        reason: reason(a.reason, &names),
                        names,
                        timeout_ms: a.timeout_ms,
                        user_input: None,
                    };
                    api.arm_wait(&a.run_id, &body).await?
                }
            };
            block(api, &a.run_id, w, a.budget_s, cancelled).await
        }
        "wait_for_any" => {
            let a: WaitForAny = args(arguments)?;
            let w = match &a.wait_id {
                Some(id) => api.get_wait(&a.run_id, id, 0).await?,
                None => {
                    if a.names.is_empty() {
                        return Err(ToolError::invalid(
                            "`names` (1 to 8) is required to arm a wait",
                        ));
                    }
                    let body = ArmWait {
                        kind: "any".into(),
                        reason: reason(a.reason, &a.names),
                        names: a.names,
                        timeout_ms: a.timeout_ms,
                        user_input: Some(a.user_input.unwrap_or(true)),
                    };
                    api.arm_wait(&a.run_id, &body).await?
                }
            };
            block(api, &a.run_id, w, a.budget_s, cancelled).await
        }
        "raise_signal" => {
            let a: RaiseSignalArgs = args(arguments)?;
            let body = RaiseSignal {
                name: a.name,
                data: a.data,
                signal_id: a.signal_id,
                wake: a.wake,
            };
            Outcome::of(api.raise_signal(&a.run_id, &body).await?)
        }
        "list_signals" => {
            let a: ListSignals = args(arguments)?;
            Outcome::of(
                api.list_signals(&a.run_id, a.limit, a.before.as_deref())
                    .await?,
            )
        }
        "claim_turn" => {
            let a: ClaimTurn = args(arguments)?;
            let t = api
                .claim_turn(
                    &a.run_id,
                    a.lease_ms.unwrap_or(60_000),
                    a.timeout_s.unwrap_or(10).min(MAX_BUDGET_S),
                )
                .await?;
            match t {
                Some(t) => Outcome::of(&t).map(|o| o.with("claimed", json!(true))),
                None => Outcome::of(json!({})).map(|o| {
                    o.with("claimed", json!(false))
                        .with("next", json!("no turn queued in time: call again"))
                }),
            }
        }
        "ack_turn" => {
            let a: AckTurn = args(arguments)?;
            Outcome::of(api.ack_turn(&a.run_id, &a.turn_id, a.claim).await?)
        }
        "cancel_wait" => {
            let a: CancelWait = args(arguments)?;
            Outcome::of(api.cancel_wait(&a.run_id, &a.wait_id).await?)
        }
        "receipt_show" => {
            let a: ReceiptShow = args(arguments)?;
            Outcome::of(api.receipt(&a.receipt_id).await?)
        }
        "deliveries_list" => {
            let a: DeliveriesList = args(arguments)?;
            let q = ListQuery {
                state: a.state,
                subscription: a.subscription_id,
                limit: a.limit,
                before: a.before,
                ..ListQuery::default()
            };
            Outcome::of(api.deliveries(&q).await?)
        }
        "dead_letters_replay" => {
            let a: DeadLettersReplay = args(arguments)?;
            if a.confirm && a.expect.is_none() {
                return Err(ToolError::invalid(
                    "confirm needs `expect`: the count a preview (confirm false) returned",
                ));
            }
            let req = ReplayRequest {
                filter: ReplayFilter {
                    from: a.from,
                    to: a.to,
                    error_class: a.error_class,
                },
                dry_run: Some(!a.confirm),
                expect: a.expect.filter(|_| a.confirm),
                limit: None,
            };
            let out = api.replay_dead_letters(&a.subscription_id, &req).await?;
            let next = if a.confirm {
                if out.more {
                    "more remain: preview again, then confirm with the new count"
                } else {
                    "replayed"
                }
            } else {
                "preview only, nothing replayed: call again with confirm: true and expect: <count>"
            };
            Outcome::of(&out).map(|o| o.with("next", json!(next)))
        }
        "subscription_pause" => {
            let a: SubscriptionArgs = args(arguments)?;
            Outcome::of(api.pause_subscription(&a.subscription_id).await?)
        }
        "subscription_resume" => {
            let a: SubscriptionArgs = args(arguments)?;
            Outcome::of(api.resume_subscription(&a.subscription_id).await?)
        }
        other => Err(ToolError::invalid(format!("no tool named {other:?}"))),
    }
}
