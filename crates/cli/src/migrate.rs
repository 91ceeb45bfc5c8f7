//! `trigger-bridge migrate`: create or upgrade the store's schema in the data dir the server would use
//! (`--data-dir`, else the config's `[server].data_dir`, else `./data`; issue #9 defect 14).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// `migrate` flags.
#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// Directory of the SQLite store [default: [server].data_dir of --config, else ./data].
    #[arg(long, env = "TRIGGER_BRIDGE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Configuration file whose [server].data_dir is used (only that key is read; secrets need not be set).
    #[arg(long, short, env = "TRIGGER_BRIDGE_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The data dir `migrate` works on. Errors: the config file cannot be read or parsed.
pub fn data_dir(args: &MigrateArgs) -> anyhow::Result<PathBuf> {
    if let Some(d) = &args.data_dir {
        return Ok(d.clone());
    }
    if let Some(c) = &args.config {
        if let Some(d) = configured_data_dir(c)? {
            return Ok(d);
        }
    }
    Ok(PathBuf::from("./data"))
}

fn configured_data_dir(path: &Path) -> anyhow::Result<Option<PathBuf>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let cfg: crate::config::Config =
        toml::from_str(&text).with_context(|| format!("{}", path.display()))?;
    Ok(cfg.server.data_dir)
}

/// Runs `migrate`: locks the data dir (refused while a server uses it), opens and migrates the store.
pub fn run(args: MigrateArgs) -> anyhow::Result<i32> {
    let dir = data_dir(&args)?;
    let _lock = crate::data_lock::acquire(&dir)?;
    let s = tb_store::sqlite::SqliteStore::open_dir(&dir)?;
    println!(
        "store {} is at schema version {}",
        s.path().display(),
        tb_store::sqlite::SCHEMA_VERSION
    );
    Ok(0)
}
