//! Write a `triggers.v2` service in Rust (guide: `docs/write-a-service.md`, wire
//! reference: `docs/wire.md`).
//!
//! A [`Service`] declares typed [`Action`]s (input and result types with `serde` + `schemars`, a
//! timeout, a retry policy, a DLQ subject) and NATS sources. [`Service::run`] connects, subscribes to
//! both flow broadcast subjects (every replica gets every update), registers the manifest (10 s,
//! failing fast), applies the flows of the reply, pulls from one durable JetStream consumer per
//! source on the stream `triggers-sources-<service>` (env `TRIGGERS_NATS_SOURCE_STREAM` overrides),
//! heartbeats every 5 s, runs handlers with their timeout and retries (`-NAK` with the backoff
//! delay), publishes a CompletionEvent per execution and a DLQ entry on exhaustion, and on Ctrl-C /
//! SIGTERM stops pulling, finishes what is in flight and sends a last heartbeat with
//! `shutting_down: true`.
//!
//! ```no_run
//! use tb_sdk::{Action, Context, HandlerError, Service};
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Greet { name: String }
//! #[derive(serde::Serialize, schemars::JsonSchema)]
//! struct Greeting { text: String }
//! # async fn main_() -> Result<(), tb_sdk::Error> {
//! Service::new("greeter")
//!     .source("inbound", "triggers.v2.greeter.inbound")
//!     .action(Action::new("greet", |_ctx: Context, g: Greet| async move {
//!         Ok::<_, HandlerError>(Greeting { text: format!("hello, {}", g.name) })
//!     }))
//!     .run("nats://127.0.0.1:4222")
//!     .await
//! # }
//! ```

mod action;
mod flows;
mod handle;
mod service;

pub use action::{schema_of, Action, Context, HandlerError, DEFAULT_TIMEOUT};
pub use flows::Flows;
pub use service::{Error, Service, REGISTER_TIMEOUT};
pub use tb_wire as wire;
