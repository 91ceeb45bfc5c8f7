//! Which store `serve` runs on, and opening it: SQLite in the data dir (the default; the dir is locked
//! for this one process) or PostgreSQL at a URL (shared by every replica; nothing is locked here, the
//! database's row locks and constraints keep replicas apart).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tb_store::Store;

use crate::db_url;

/// The store chosen by the flags and `[server]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// SQLite in `<dir>/trigger-bridge.db`.
    Sqlite { dir: PathBuf },
    /// PostgreSQL at `url` with a pool of `pool_size` connections.
    Postgres { url: String, pool_size: usize },
}

impl Choice {
    /// `--database-url` (or `TRIGGER_BRIDGE_DATABASE_URL`) over `[server].database_url`: PostgreSQL when
    /// either is set, else SQLite in `data_dir`.
    pub fn pick(url: Option<String>, pool_size: Option<usize>, data_dir: &Path) -> Choice {
        match url.filter(|u| !u.is_empty()) {
            Some(url) => Choice::Postgres {
                url,
                pool_size: pool_size.unwrap_or(db_url::DEFAULT_POOL_SIZE),
            },
            None => Choice::Sqlite {
                dir: data_dir.to_path_buf(),
            },
        }
    }
}

/// An open store and what is printed about it.
pub struct Opened {
    pub store: Arc<dyn Store>,
    /// `sqlite <path>` or `postgresql <redacted URL> (N connections)`, for the banner and the log.
    pub label: String,
    /// SQLite only: the data dir lock, held until the process ends.
    pub lock: Option<crate::data_lock::DataDirLock>,
}

/// Opens (and migrates) the chosen store. `queue_capacity` bounds the jobs waiting for the SQLite
/// writer or for a PostgreSQL connection. Errors: the data dir is in use or cannot be opened, or
/// PostgreSQL refuses, is unreachable or cannot be migrated; the message names the directory or the
/// redacted URL (never the password).
pub async fn open(choice: &Choice, queue_capacity: usize) -> anyhow::Result<Opened> {
    match choice {
        Choice::Sqlite { dir } => {
            let lock = crate::data_lock::acquire(dir)?;
            let opts = tb_store::sqlite::StoreOptions {
                writer: tb_store::sqlite::writer::WriterOptions { queue_capacity },
                ..Default::default()
            };
            let store = tb_store::sqlite::SqliteStore::open_dir_with(dir, opts)
                .with_context(|| format!("opening the store in {}", dir.display()))?;
            let label = format!("sqlite {}", store.path().display());
            Ok(Opened {
                store: Arc::new(store),
                label,
                lock: Some(lock),
            })
        }
        Choice::Postgres { url, pool_size } => {
            let shown = db_url::redact(url);
            if let Some(e) = db_url::problems(Some(url), Some(*pool_size)).first() {
                anyhow::bail!("{e}");
            }
            let opts = tb_store::postgres::PoolOptions {
                connections: *pool_size,
                queue_capacity,
            };
            let store = tb_store::postgres::PgStore::connect(url, opts)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "opening the PostgreSQL store at {shown}: {}",
                        db_url::redact_text(&e.to_string())
                    )
                })?;
            let label = format!(
                "postgresql {shown} ({} connections)",
                store.pool().live_connections()
            );
            Ok(Opened {
                store: Arc::new(store),
                label,
                lock: None,
            })
        }
    }
}
