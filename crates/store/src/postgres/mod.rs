//! The PostgreSQL backend's adapter: [`Db`](crate::sql::Db) over a PostgreSQL transaction
//! ([`db`]), a pool of connection threads running jobs as READ COMMITTED transactions ([`pool`]),
//! versioned migrations ([`mod@migrate`]), connection settings from a URL ([`config`]) and the test
//! harness ([`testing`]).
//!
//! The driver is the `postgres` crate: the synchronous face of `tokio-postgres`, each client driven by
//! its own small runtime on its connection thread. Synchronous because the shared data-access code in
//! `crate::sql` is synchronous (the SQLite backend runs it on its writer thread), so both backends run
//! the very same code; the async callers reach a connection through the pool's queue.

pub mod config;
pub mod db;
pub mod error;
pub mod migrate;
pub mod pool;
#[doc(hidden)]
pub mod testing;

pub use config::{connect, parse_url};
pub use db::{PgDb, StatementCache};
pub use error::classify;
pub use migrate::{migrate, schema_version, MIGRATIONS};
pub use pool::{PgPool, PoolOptions};

/// A random 64-bit number (from the standard library's per-process random hash keys and the clock),
/// for retry jitter and test schema names; not for secrets.
pub(crate) fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now())
}
