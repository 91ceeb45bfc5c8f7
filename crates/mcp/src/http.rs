//! MCP over streamable HTTP (`trigger-bridge mcp --http ADDR`), mounted at `/mcp`.
//!
//! The endpoint acts with the bridge's API key, so it must not lend that key to whoever can reach it:
//! when a key is set, every request must carry `Authorization: Bearer <the same key>` (compared in
//! constant time), so a caller gains nothing it did not already hold. `Host` must be the bound
//! address or a loopback name (DNS-rebinding protection of the MCP SDK).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tb_client::Client;

use crate::Bridge;

/// Serves MCP over streamable HTTP on `addr` until the process is stopped. `api_key`: the key the
/// bridge uses, also required from HTTP clients. Errors: the address cannot be bound.
pub async fn serve_http(
    api: Client,
    api_key: Option<String>,
    addr: SocketAddr,
) -> anyhow::Result<()> {
    if api_key.is_none() {
        anyhow::ensure!(
            addr.ip().is_loopback(),
            "--http {addr} without an API key would open the API to the network through this endpoint \
             (it asks callers for the key it was given); set --api-key / TRIGGER_BRIDGE_API_KEY, or \
             listen on a loopback address"
        );
        eprintln!(
            "trigger-bridge mcp: no API key set, so this endpoint asks for none (loopback only)"
        );
    }
    let bridge = Bridge::new(api);
    bridge.preflight().await?;
    let mut config = StreamableHttpServerConfig::default();
    config.allowed_hosts.push(addr.ip().to_string());
    config.allowed_hosts.push(addr.to_string());
    let service = StreamableHttpService::new(
        move || Ok(bridge.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let want = api_key.map(|k| Sha256::digest(k.as_bytes()).to_vec());
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |req: Request, next: Next| {
                    let want = want.clone();
                    async move { guard(want.as_deref(), req, next).await }
                },
            ));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!(
        "trigger-bridge mcp: streamable HTTP on http://{}/mcp",
        listener.local_addr()?
    );
    axum::serve(listener, router).await?;
    Ok(())
}

async fn guard(want: Option<&[u8]>, req: Request, next: Next) -> Response {
    if let Some(want) = want {
        let got = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, k)| k)
            .map(|k| Sha256::digest(k.trim().as_bytes()).to_vec());
        let ok = got.is_some_and(|g| bool::from(g.as_slice().ct_eq(want)));
        if !ok {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                axum::Json(serde_json::json!({
                    "error": "unauthenticated",
                    "message": "send Authorization: Bearer <the API key this MCP server was started with>"
                })),
            )
                .into_response();
        }
    }
    next.run(req).await
}
