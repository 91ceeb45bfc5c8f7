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
/// (never echoing the password).
pub fn parse_url(url: &str) -> StoreResult<postgres::Config> {
    let mut cfg = postgres::Config::from_str(url)
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
pub fn connect(cfg: &postgres::Config) -> StoreResult<postgres::Client> {
    cfg.connect(postgres::NoTls).map_err(|e| {
        StoreError::Unavailable(format!(
            "cannot connect to PostgreSQL: {}",
            super::error::text(&e)
        ))
    })
}
