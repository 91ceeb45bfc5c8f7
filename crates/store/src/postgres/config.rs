//! Connection settings of the PostgreSQL backend, from a URL.

use std::str::FromStr;
use std::time::Duration;

use crate::{StoreError, StoreResult};

/// Connect timeout used when the URL sets none (`connect_timeout`, s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a connection URL, `postgres://user[:password]@host[:port]/database[?param=value&...]` (or
/// `postgresql://`, or the `key=value` form), as libpq does. Parameters include `connect_timeout` (s;
/// default [`DEFAULT_CONNECT_TIMEOUT`]), `application_name` (default `trigger-bridge`), `sslmode`
/// (only `disable`/`prefer` work: the store connects without TLS) and `options`, the server settings
/// of each session, percent-encoded: `options=-c%20search_path%3Dtenant_a` puts every table in schema
/// `tenant_a` (what the test harness does). Errors: [`StoreError::Database`] naming what is wrong
/// (never echoing the password). The settings are `tokio-postgres`'s: the pool drives its clients
/// itself ([`connect_async`]); [`connect`] opens a synchronous client on the same settings.
pub fn parse_url(url: &str) -> StoreResult<tokio_postgres::Config> {
    let mut cfg = tokio_postgres::Config::from_str(url)
        .map_err(|e| StoreError::Database(format!("invalid PostgreSQL URL: {e}")))?;
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    if cfg.get_application_name().is_none() {
        cfg.application_name("trigger-bridge");
    }
    Ok(cfg)
}

/// Opens one client (without TLS) on `cfg`. Must not be called on a Tokio runtime thread (the driver
/// runs its own runtime): call it from a plain thread or `spawn_blocking`. Errors: every failure
/// (unreachable server, refused login, unknown database) is [`StoreError::Unavailable`] with the
/// server's or the socket's reason.
pub fn connect(cfg: &tokio_postgres::Config) -> StoreResult<postgres::Client> {
    postgres::Config::from(cfg.clone())
        .connect(postgres::NoTls)
        .map_err(|e| unreachable_server(&e))
}

/// Opens one asynchronous client (without TLS) on `cfg`, on the current-thread runtime `rt`, and
/// spawns its connection task there: the task (which reads and writes the socket) runs only while
/// `rt.block_on` runs, which is how the pool's connection thread drives everything it sends. Must not
/// be called on a Tokio runtime thread. Errors: as [`connect`] (every failure is
/// [`StoreError::Unavailable`]; the connect timeout is the URL's `connect_timeout`).
pub fn connect_async(
    rt: &tokio::runtime::Runtime,
    cfg: &tokio_postgres::Config,
) -> StoreResult<tokio_postgres::Client> {
    let (client, connection) = rt
        .block_on(cfg.connect(tokio_postgres::NoTls))
        .map_err(|e| unreachable_server(&e))?;
    rt.spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PostgreSQL connection ended with an error");
        }
    });
    Ok(client)
}

fn unreachable_server(e: &tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!(
        "cannot connect to PostgreSQL: {}",
        super::error::text(e)
    ))
}
