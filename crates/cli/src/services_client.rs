//! `trigger-bridge services ...` (issue #12): the triggers.v2 services registered over NATS.

use anyhow::Result;

use crate::api_client::{print_list, Api, ClientOpts};

const SERVICES: &str =
    "SERVICE=name VERSION=serviceVersion LIVENESS=liveness LAST_HEARTBEAT=lastHeartbeatAt \
    ACTIONS=actions OTHER_BUILD=otherBuild HASH=manifestHash";

/// `trigger-bridge services ...` (issue #12)
#[derive(clap::Subcommand, Debug)]
pub enum ServicesCmd {
    /// List the triggers.v2 services registered over NATS and their liveness (down after 3 missed
    /// heartbeats)
    List,
}

/// Runs one `services` command.
pub async fn services(o: &ClientOpts, c: ServicesCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        ServicesCmd::List => {
            if let Some(v) = api.get("/v1/services", &[]).await? {
                print_list(
                    &v,
                    "services",
                    SERVICES,
                    "no services registered (they register over NATS: serve --nats-url)",
                );
            }
        }
    }
    Ok(())
}
