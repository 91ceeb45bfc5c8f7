//! The PostgreSQL backend's adapter: [`Db`](crate::sql::Db) over a PostgreSQL transaction
//! ([`db`]), a pool of connection threads running jobs as READ COMMITTED transactions ([`pool`]),
//! versioned migrations ([`mod@migrate`]), connection settings from a URL ([`config`]) and the test
//! harness ([`testing`]).
//!
//! The pool's driver is `tokio-postgres`, driven synchronously: each connection thread owns a
//! current-thread runtime and one client, and blocks on it, sending independent statements together
//! (a transaction's `BEGIN` with its first statement; [`Db::exec_many`](crate::sql::Db::exec_many) in
//! one round trip). The synchronous `postgres` crate ([`connect`]) serves migrations, the configuration
//! listener and tests. Synchronous because the shared data-access code in
//! `crate::sql` is synchronous (the SQLite backend runs it on its writer thread), so both backends run
//! the very same code; the async callers reach a connection through the pool's queue.

pub mod backend;
pub mod config;
pub mod db;
pub mod error;
pub mod listen;
pub mod migrate;
pub mod notify;
pub mod pool;
#[doc(hidden)]
pub mod testing;

pub use backend::{PgBackend, PgStore};
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

/// Opens the PostgreSQL store's pool for `url` (see [`parse_url`]): applies the missing migrations on
/// one connection first (see [`migrate()`]; safe while other replicas do the same), then starts the
/// pool's connections. Blocking (connects and migrates): call it outside async code or in
/// `spawn_blocking`. Errors: a bad URL (`Database`), an unreachable server (`Unavailable`), a failed
/// migration (typed by [`classify`]).
pub fn open(url: &str, opts: PoolOptions) -> crate::StoreResult<PgPool> {
    let cfg = parse_url(url)?;
    let (from, to) = migrate(&mut connect(&cfg)?)?;
    if from != to {
        tracing::info!(from, to, "PostgreSQL schema migrated");
    }
    PgPool::start(&cfg, opts)
}
