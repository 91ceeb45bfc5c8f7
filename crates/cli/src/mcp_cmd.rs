//! `trigger-bridge mcp`: the Model Context Protocol server for agents (`tb_mcp`), over stdio or
//! streamable HTTP, acting on the server named by `--server` with `--api-key`.

use std::net::SocketAddr;

use anyhow::Result;

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
    let api = o.client()?;
    match a.http {
        Some(addr) => tb_mcp::serve_http(api, o.key().map(str::to_owned), addr).await,
        None => tb_mcp::serve_stdio(api).await,
    }
}
