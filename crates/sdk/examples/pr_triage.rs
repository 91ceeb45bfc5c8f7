//! A triggers.v2 service with one action, `triage`: it takes a pull request's repository and number
//! (what a GitHub webhook binding hands a run) and answers whether it accepted it.
//!
//!   NATS_URL=nats://127.0.0.1:4222 cargo run -p trigger-bridge-sdk --example pr_triage
//!
//! `TRIAGE_WORK_MS` makes each triage take that long (to watch retries and replicas at work).
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tb_sdk::{Action, Context, HandlerError, Service};

#[derive(Deserialize, JsonSchema)]
struct PullRequest {
    repository: String,
    number: u64,
}

#[derive(Serialize, JsonSchema)]
struct Triaged {
    accepted: bool,
}

async fn triage(ctx: Context, pr: PullRequest) -> Result<Triaged, HandlerError> {
    let work: u64 = std::env::var("TRIAGE_WORK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(work)).await;
    println!(
        "triaged {}#{} (run {}, attempt {})",
        pr.repository, pr.number, ctx.envelope.flow_run_id, ctx.attempt
    );
    Ok(Triaged {
        accepted: !pr.repository.is_empty(),
    })
}

#[tokio::main]
async fn main() -> Result<(), tb_sdk::Error> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    Service::new("pr-bot")
        .version(env!("CARGO_PKG_VERSION"))
        .source("inbound", "triggers.v2.pr-bot.inbound")
        .action(
            Action::new("triage", triage)
                .description("Accept or refuse a pull request")
                .timeout(Duration::from_secs(10))
                .retry(3, Duration::from_millis(100), 2.0, Duration::from_secs(5)),
        )
        .run(&url)
        .await
}
