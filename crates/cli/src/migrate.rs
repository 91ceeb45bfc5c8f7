//! `trigger-bridge migrate`: create or upgrade the store's schema, then exit. The SQLite store in the
//! data dir the server would use (`--data-dir`, else the config's `[server].data_dir`, else `./data`;
//! docs/operations.md), or a PostgreSQL database (`--database-url`, else the config's
//! `[server].database_url`).
//!
//! Copying a store from one backend to another (`migrate --from ... --to ...`) is not built; it would
//! be two more flags here, next to these, and a third branch of [`Target`].

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::db_url;

/// `migrate` flags.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// Directory of the SQLite store [default: [server].data_dir of --config, else ./data].
    #[arg(long, env = "TRIGGER_BRIDGE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL database to migrate instead, postgres://user[:password]@host[:port]/db
    /// [default: [server].database_url of --config]; wins over --data-dir. Printed with the password masked.
    #[arg(long, env = "TRIGGER_BRIDGE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Configuration file whose [server].data_dir / database_url is used (only those keys are read;
    /// secrets need not be set).
    #[arg(long, short, env = "TRIGGER_BRIDGE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Copy a whole SQLite store into PostgreSQL instead (`--from sqlite:DIR --to postgres://...`).
    #[command(flatten)]
    pub copy: crate::migrate_copy::CopyArgs,
}

/// The store `migrate` works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The SQLite store in this data dir.
    Sqlite(PathBuf),
    /// The PostgreSQL database at this URL.
    Postgres(String),
}

/// The store `migrate` works on: `--database-url`, `--data-dir`, then the config's `database_url`,
/// then its `data_dir`, then `./data`. Errors: the config file cannot be read or parsed.
pub fn target(args: &MigrateArgs) -> anyhow::Result<Target> {
    if let Some(u) = args.database_url.as_ref().filter(|u| !u.is_empty()) {
        return Ok(Target::Postgres(u.clone()));
    }
    if let Some(d) = &args.data_dir {
        return Ok(Target::Sqlite(d.clone()));
    }
    if let Some(c) = &args.config {
        let server = configured_server(c)?;
        if let Some(u) = server.database_url {
            return Ok(Target::Postgres(u));
        }
        if let Some(d) = server.data_dir {
            return Ok(Target::Sqlite(d));
        }
    }
    Ok(Target::Sqlite(PathBuf::from("./data")))
}

/// The `[server]` section of the config file at `path`. Errors: it cannot be read or parsed.
pub fn configured_server(path: &Path) -> anyhow::Result<crate::config::ServerSection> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let cfg: crate::config::Config =
        toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    Ok(cfg.server)
}

/// Runs `migrate`. SQLite: locks the data dir (refused while a server uses it), opens and migrates
/// the store, prints `store <path> is at schema version N`. PostgreSQL: applies the missing
/// migrations (safe while replicas run or start: they take turns on an advisory lock) and prints
/// `PostgreSQL store <redacted URL>: schema version FROM -> TO` (`already at` when nothing was to
/// do). Errors: the store cannot be opened, reached or migrated (the URL only redacted).
pub async fn run(args: MigrateArgs) -> anyhow::Result<i32> {
    match target(&args)? {
        Target::Sqlite(dir) => {
            let _lock = crate::data_lock::acquire(&dir)?;
            let s = tb_store::sqlite::SqliteStore::open_dir(&dir)?;
            println!(
                "store {} is at schema version {}",
                s.path().display(),
                tb_store::sqlite::SCHEMA_VERSION
            );
        }
        Target::Postgres(url) => {
            let shown = db_url::redact(&url);
            if let Some(e) = db_url::problems(Some(&url), None).first() {
                anyhow::bail!("{e}");
            }
            // The driver is synchronous and runs its own runtime: off this one.
            let (from, to) = tokio::task::spawn_blocking(move || {
                let cfg = tb_store::postgres::parse_url(&url)?;
                tb_store::postgres::migrate(&mut tb_store::postgres::connect(&cfg)?)
            })
            .await
            .context("the migration thread failed")?
            .map_err(|e| {
                anyhow::anyhow!(
                    "migrating the PostgreSQL store at {shown}: {}",
                    db_url::redact_text(&e.to_string())
                )
            })?;
            if from == to {
                println!("PostgreSQL store {shown}: already at schema version {to}");
            } else {
                println!("PostgreSQL store {shown}: schema version {from} -> {to}");
            }
        }
    }
    Ok(0)
}
