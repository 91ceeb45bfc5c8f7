//! A triggers.v2 service with one action, `triage`: it takes a pull request's repository and number
//! and answers whether it accepted it. Start the bridge (with --nats-url) first, then run
//! `cargo run -p trigger-bridge-sdk --example pr_triage` (env NATS_URL, TRIAGE_WORK_MS: work per action).
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
    let work_ms = std::env::var("TRIAGE_WORK_MS").map_or(0, |v| v.parse().unwrap_or(0));
    tokio::time::sleep(Duration::from_millis(work_ms)).await;
    let (run, attempt, PullRequest { repository, number }) =
        (&ctx.envelope.flow_run_id, ctx.attempt, pr);
    println!("triaged {repository}#{number} (run {run}, attempt {attempt})");
    let accepted = !repository.is_empty();
    Ok(Triaged { accepted })
}

#[tokio::main]
async fn main() -> Result<(), tb_sdk::Error> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(ansi)
        .init();
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let triage = Action::new("triage", triage)
        .timeout(Duration::from_secs(10))
        .retry(3, Duration::from_millis(100), 2.0, Duration::from_secs(5));
    Service::new("pr-bot")
        .version(env!("CARGO_PKG_VERSION"))
        .source("inbound", "triggers.v2.pr-bot.inbound")
        .action(triage)
        .run(&url)
        .await
}
