//! Workflows: the approved definitions a run executes (DESIGN §2). A payload never chooses one.

use serde::{Deserialize, Serialize};

/// How a run's work is carried out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "executor", rename_all = "snake_case")]
pub enum Executor {
    /// The run completes at once when its delivery is performed.
    Noop,
    /// A Standard Webhooks-signed POST to `url`; 200/201/204 completes the run, 202 leaves it running
    /// until the worker reports `POST /v1/runs/{runId}/result`. `secret` is the resolved signing key.
    Http {
        url: String,
        #[serde(skip)]
        secret: Vec<u8>,
        /// Per-request timeout in ms (default 15 000).
        timeout_ms: u64,
        /// Whether `url` may reach a private, loopback, link-local or ULA address (a worker on the
        /// operator's own network). Without it such a URL, or a name that resolves to such an address,
        /// fails the attempt with `destination_forbidden` (SSRF guard).
        #[serde(default)]
        allow_private: bool,
        /// Worker answers that are never retried: the delivery is dead-lettered at the first one,
        /// with `http_<status>` as its reason ([`crate::delivery::http_answer_failure`]). Default
        /// [`crate::delivery::DEFAULT_NON_RETRYABLE_STATUSES`] (`[410]`).
        #[serde(default = "default_non_retryable_statuses")]
        non_retryable_statuses: Vec<u16>,
    },
    /// A long-lived session driven by an agent or service through the API (turns, signals, waits). It
    /// runs until stopped. `config` is the operator-set session template (identity, agent, model/provider
    /// policy, namespace, tools, repository access, budgets, concurrency): opaque here, returned to the
    /// driver in the start turn, never filled from a payload (signals-and-connectors §0.2).
    Session {
        #[serde(default)]
        config: serde_json::Value,
        #[serde(default)]
        mailbox: crate::signal::MailboxPolicy,
    },
    /// An action of a `triggers.v2` service over NATS: the delivery publishes the run's
    /// inputs to the service's inbound subject through JetStream (`Nats-Msg-Id` = the delivery id);
    /// the PubAck marks the delivery delivered and the run `running`; the service's CompletionEvent
    /// completes or fails the run. A service that is not up fails the attempt (retried per policy).
    Nats {
        /// The registered service's name.
        service: String,
        /// The action of that service.
        action: String,
        /// The flow is a Durable Timer lineage: released to the service only when its manifest
        /// passes the gate (`tb_wire::durable_timer::check_release`).
        #[serde(default)]
        durable_timer: bool,
    },
}

fn default_non_retryable_statuses() -> Vec<u16> {
    crate::delivery::DEFAULT_NON_RETRYABLE_STATUSES.to_vec()
}

/// An approved workflow template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: String,
    #[serde(flatten)]
    pub executor: Executor,
}
