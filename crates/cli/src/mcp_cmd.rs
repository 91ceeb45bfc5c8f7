//! `trigger-bridge mcp`: the Model Context Protocol server for agents (`tb_mcp`), over stdio or
//! streamable HTTP, acting on the server named by `--server` with `--api-key`.

use std::net::SocketAddr;

use anyhow::{anyhow, Result};

use crate::api_client::ClientOpts;

// Flags of `trigger-bridge mcp` (plain comments: a doc comment would replace the subcommand's help).
#[derive(clap::Args, Debug)]
pub struct McpArgs {
    /// Serve streamable HTTP on this address (at /mcp) instead of stdio; a loopback address unless
    /// the endpoint is behind your own proxy. With an API key set, clients must send it as a bearer token
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
}

/// Runs the MCP server until the client leaves (stdio) or the process is stopped (HTTP).
pub async fn run(o: &ClientOpts, a: McpArgs) -> Result<()> {
    let mut api = tb_client::Client::new(&o.server).map_err(|e| anyhow!("--server: {e}"))?;
    if let Some(k) = &o.api_key {
        api = api.with_api_key(k);
    }
    match a.http {
        Some(addr) => tb_mcp::serve_http(api, o.api_key.clone(), addr).await,
        None => tb_mcp::serve_stdio(api).await,
    }
}
