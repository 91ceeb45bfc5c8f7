//! The PostgreSQL [`Backend`]: the shared data-access code of `crate::sql`, each call one transaction on
//! the [`PgPool`]. Several replicas share one database; correctness comes from the row locks and
//! constraints the shared code takes (`FOR UPDATE`, `SKIP LOCKED`, unique keys), never from one writer.

use async_trait::async_trait;

use super::pool::{PgPool, PoolOptions};
use crate::sql::{Backend, Db, SqlStore};
use crate::{StoreError, StoreResult};

/// The PostgreSQL backend: a pool of connection threads.
pub struct PgBackend {
    pool: PgPool,
    /// Connection settings, for the configuration listener started on first use.
    cfg: tokio_postgres::Config,
    /// The hint counters ([`super::listen`]), once started.
    hints: std::sync::Mutex<Option<super::listen::Hints>>,
    /// This store's sender id in wake-up payloads (random per store handle).
    sender: String,
    /// Sends this store's wake-ups to the other replicas ([`super::notify`]).
    notifier: super::notify::Notifier,
}

/// The PostgreSQL store. Cheap to share behind an `Arc<dyn Store>`.
pub type PgStore = SqlStore<PgBackend>;

impl SqlStore<PgBackend> {
    /// Connects to `url` (`postgres://user@host:port/db?options=...`, see
    /// [`parse_url`](super::config::parse_url)), applies the missing migrations (safe while other
    /// replicas start at once) and starts the pool. Runs the blocking driver work on its own thread, so
    /// it may be awaited from any runtime. Errors: a bad URL (`Database`), an unreachable server
    /// (`Unavailable`), a failed migration.
    pub async fn connect(url: &str, opts: PoolOptions) -> StoreResult<PgStore> {
        let url = url.to_string();
        let cfg = super::parse_url(&url)?;
        let pool = tokio::task::spawn_blocking(move || super::open(&url, opts))
            .await
            .map_err(|e| StoreError::Database(format!("opening PostgreSQL failed: {e}")))??;
        let sender = format!("{:016x}", super::random_u64());
        Ok(SqlStore::new(PgBackend {
            pool,
            notifier: super::notify::Notifier::new(cfg.clone(), sender.clone()),
            cfg,
            hints: Default::default(),
            sender,
        }))
    }

    /// The pool (connection count, ping).
    pub fn pool(&self) -> &PgPool {
        &self.backend.pool
    }
}

impl PgBackend {
    /// The listener's counters, starting the listener on first use.
    fn hints(&self) -> super::listen::Hints {
        let mut h = self.hints.lock().unwrap_or_else(|p| p.into_inner());
        h.get_or_insert_with(|| super::listen::spawn(self.cfg.clone(), self.sender.clone()))
            .clone()
    }
}

#[async_trait]
impl Backend for PgBackend {
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.pool.write(f).await
    }

    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        self.pool.read(f).await
    }

    async fn read_now<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&dyn Db) -> StoreResult<T> + Send + 'static,
    {
        // Every statement is a network round trip: nothing to gain from the calling thread, but a point
        // read skips the BEGIN / COMMIT round trips of a transaction (autocommit).
        self.pool.read_point(f).await
    }

    fn is_alive(&self) -> bool {
        self.pool.live_connections() > 0
    }

    fn config_change_hints(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.hints().config)
    }

    fn announce(&self, wake: crate::Wake) {
        self.notifier.announce(wake);
    }

    fn wake_hints(&self, wake: crate::Wake) -> Option<tokio::sync::watch::Receiver<u64>> {
        // A replica that listens for wake-ups is a server that will send them too: connect its
        // notifier now rather than at its first commit.
        self.notifier.start();
        Some(self.hints().wake(wake))
    }

    fn batching(&self) -> crate::sql::batch::Batching {
        // Attempt and receipt commits share transactions: one statement per table for the whole
        // batch (`crate::sql::attempt_batch`, `crate::sql::ingest_batch`). Each kind may hold a
        // quarter of the connections (2 of the default 8): measured end to end on the 2-core bench
        // machine, 1-2 batches in flight per kind cost less CPU per event than 4 at the same rate,
        // since the items that wait form bigger batches.
        crate::sql::batch::Batching {
            max_items: crate::sql::batch::MAX_BATCH,
            in_flight: (self.pool.connections() / 4).max(1),
            // As many as the pool's own job queue holds.
            max_waiting: self.pool.capacity(),
        }
    }

    fn facts(&self) -> crate::BackendFacts {
        crate::BackendFacts {
            backend: "postgresql",
            connections: Some(self.pool.live_connections()),
        }
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
