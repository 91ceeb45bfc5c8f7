//! `trigger-bridge services ...`: the triggers.v2 services registered over NATS.

use anyhow::Result;

use crate::api_client::{print_list, Api, ClientOpts};

const SERVICES: &str =
    "SERVICE=name VERSION=serviceVersion LIVENESS=liveness REPLICAS=replicasLive \
    LAST_HEARTBEAT=lastHeartbeatAt ACTIONS=actions OTHER_BUILD=otherBuild HASH=manifestHash";

/// `trigger-bridge services ...`
#[derive(clap::Subcommand, Debug)]
pub enum ServicesCmd {
    /// List the triggers.v2 services registered over NATS and their liveness (down after 3 missed
    /// heartbeats)
    List,
    /// The newest dead letters the services wrote (and the bridge's source DLQ), from the stream
    /// triggers-dlq: kind, run, error. Bodies are not shown
    DeadLetters {
        /// Only this service's entries
        #[arg(long)]
        service: Option<String>,
        /// How many (1..=500)
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

const DEAD_LETTERS: &str =
    "OCCURRED=occurredAt KIND=kind RUN=runId ERROR=error RETRIES=retryCount SUBJECT=subject";

/// Runs one `services` command.
pub async fn services(o: &ClientOpts, c: ServicesCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        ServicesCmd::DeadLetters { service, limit } => {
            let q = [("limit", Some(limit.to_string())), ("service", service)];
            if let Some(v) = api.get("/v1/services/dead-letters", &q).await? {
                print_list(&v, "items", DEAD_LETTERS, "no dead letters in triggers-dlq");
            }
        }
        ServicesCmd::List => {
            if let Some(v) = api.get("/v1/services", &[]).await? {
                print_list(
                    &v,
                    "services",
                    SERVICES,
                    "no services registered (a service registers over NATS when it starts; the bridge needs serve --nats-url)",
                );
            }
        }
    }
    Ok(())
}
