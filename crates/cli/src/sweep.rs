//! `trigger-bridge sweep`: one retention pass now, then exit. The pass `serve`'s sweeper runs every
//! minute (`tb_engine::sweeper::sweep_once`): raw bodies of settled receipts received before the body
//! retention, dead letters older than the dead-letter retention, expired idempotency records and settled
//! signal records older than the body retention (the server's minute also drops the previous secrets of
//! ended secret rotations; this command does not). For an operator who shortened a retention and wants
//! the space back now, and for the benchmark that counts retention's cost per event (`bench/sweep.sh`).
//!
//! The store is chosen as `serve` chooses it: a database URL (`--database-url`, else the config's
//! `database_url`) wins; else the SQLite store in `--data-dir`, else the config's `data_dir`, else
//! `./data`, which must hold a store already (a mistyped directory is refused, never created). Opening
//! the store applies its missing migrations, as `serve` does. A SQLite data dir is locked for the pass,
//! so its server must be stopped; on PostgreSQL the pass runs beside live replicas of the same version
//! (each step is its own short transaction, as theirs).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::migrate::configured_server;
use crate::store_open::{self, Choice};

/// Most jobs waiting for the store during the pass (it runs one at a time).
const QUEUE: usize = 16;
/// PostgreSQL connections the pass opens.
const PG_CONNECTIONS: usize = 1;

/// `sweep` flags.
#[derive(clap::Args, Debug)]
pub struct SweepArgs {
    /// Directory of the SQLite store [default: [server].data_dir of --config, else ./data]. The server
    /// using it must be stopped (the data dir is locked).
    #[arg(long, env = "TRIGGER_BRIDGE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL database to sweep instead, postgres://user[:password]@host[:port]/db [default:
    /// [server].database_url of --config]; wins over --data-dir. Replicas may keep running.
    #[arg(long, env = "TRIGGER_BRIDGE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Configuration file whose [server] store and retention settings are used.
    #[arg(long, short, env = "TRIGGER_BRIDGE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Days raw bodies of settled receipts are kept, counted from their receipt's arrival, and settled
    /// signal records likewise; 0 removes every settled receipt's body [default:
    /// [server].body_retention_days of --config, else 7].
    #[arg(long, value_name = "DAYS")]
    pub body_retention_days: Option<u32>,
    /// Days dead letters stay readable; 0 removes every dead letter [default:
    /// [server].dead_letter_retention_days of --config, else 14].
    #[arg(long, value_name = "DAYS")]
    pub dead_letter_retention_days: Option<u32>,
}

/// Runs one pass and prints what it removed (`--json`: one object with `bodies`, `dead_letters`,
/// `idempotency`, `signals` and `elapsed_ms`). Errors: the config cannot be read, the store cannot be
/// opened (a SQLite data dir in use by a server is refused, naming its pid), or a step of the pass
/// failed (what earlier steps removed stays removed; running the command again goes on).
pub async fn run(args: SweepArgs, json: bool) -> anyhow::Result<i32> {
    let server = match &args.config {
        Some(c) => configured_server(c)?,
        None => Default::default(),
    };
    let body_days = args
        .body_retention_days
        .unwrap_or_else(|| server.body_retention());
    let dead_letter_days = args
        .dead_letter_retention_days
        .unwrap_or_else(|| server.dead_letter_retention());
    // The store `serve` would open: a database URL wins over the data dir.
    let data_dir = args
        .data_dir
        .clone()
        .or(server.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from("./data"));
    let choice = Choice::pick(
        args.database_url.clone().or(server.database_url.clone()),
        Some(PG_CONNECTIONS),
        &data_dir,
    );
    if let Choice::Sqlite { dir } = &choice {
        let db = dir.join(tb_store::sqlite::DB_FILE);
        if !db.is_file() {
            anyhow::bail!(
                "no store to sweep: {} does not exist (pass the server's --data-dir, or --database-url)",
                db.display()
            );
        }
    }
    let opened = store_open::open(&choice, QUEUE).await?;
    let cfg =
        tb_engine::sweeper::SweeperConfig::in_days(body_days, dead_letter_days, Duration::ZERO);
    let started = Instant::now();
    let counts =
        tb_engine::sweeper::sweep_once(&*opened.store, tb_engine::clock::now_ms(), &cfg).await?;
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if json {
        let mut v = serde_json::to_value(counts)?;
        v["elapsed_ms"] = elapsed_ms.into();
        println!("{v}");
    } else {
        println!(
            "retention pass over {}: removed {} bodies (of settled receipts received over {body_days} \
             days ago), {} dead letters (over {dead_letter_days} days old), {} expired idempotency \
             records, {} settled signal records in {elapsed_ms} ms",
            opened.label, counts.bodies, counts.dead_letters, counts.idempotency, counts.signals
        );
    }
    Ok(0)
}
