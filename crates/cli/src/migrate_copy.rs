//! `trigger-bridge migrate --from sqlite:DIR --to postgres://... [--force]`: copies a whole SQLite store
//! into a PostgreSQL database once, when moving from one process to replicas (docs/operations.md,
//! "Moving from SQLite to PostgreSQL"). The copy itself is `tb_store::copy`; this module parses the two
//! ends, holds the source's data dir lock (so no server runs on it meanwhile, and none starts), shows
//! progress on stderr and prints the verification counts on stdout, failing on any mismatch.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::Context;
use tb_store::copy::{self, CopyOptions, CopyReport, Progress};
use tb_store::postgres::{PgStore, PoolOptions};
use tb_store::Store as _;

/// The copy's flags, flattened into `migrate`'s. Without `--from` and `--to`, `migrate` does what it
/// always did.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyArgs {
    /// Copy the SQLite store of this data dir into `--to`: `sqlite:DIR` (the server's --data-dir), or
    /// `sqlite:FILE` (its trigger-bridge.db). Refused while a server uses the data dir.
    #[arg(long, value_name = "sqlite:PATH", requires = "to")]
    pub from: Option<String>,
    /// The PostgreSQL database to copy into (`postgres://user@host:port/db[?options=...]`); migrated
    /// to the newest schema first, and it must be empty unless --force.
    #[arg(long, value_name = "postgres://URL", requires = "from")]
    pub to: Option<String>,
    /// Empty every table of a non-empty target first (TRUNCATE), so it ends an exact copy of the source.
    #[arg(long, requires = "from")]
    pub force: bool,
    /// Most rows per batch (one PostgreSQL transaction each).
    #[arg(long, value_name = "ROWS", default_value_t = copy::DEFAULT_BATCH_ROWS,
          value_parser = batch_rows)]
    pub batch_rows: usize,
}

/// `--batch-rows`: an integer from 1 to 100 000.
fn batch_rows(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a row count from 1 to 100000")),
    }
}

impl CopyArgs {
    /// Whether a copy was asked for (`--from` or `--to` given): what `migrate` dispatches on.
    pub fn requested(&self) -> bool {
        self.from.is_some() || self.to.is_some()
    }
}

/// The source's data dir (locked during the copy) and its database file, from `sqlite:PATH`: a
/// directory is a data dir holding `trigger-bridge.db`; a file is the database itself, in its data
/// dir. Errors: no `sqlite:` prefix, or no store there.
pub fn source_paths(from: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let path = from
        .strip_prefix("sqlite:")
        .map(|p| p.strip_prefix("//").unwrap_or(p))
        .filter(|p| !p.is_empty())
        .with_context(|| {
            format!("--from {from:?}: expected sqlite:PATH (a data dir or its .db file)")
        })?;
    let path = PathBuf::from(path);
    let (dir, file) = if path.is_dir() {
        (path.clone(), path.join(tb_store::sqlite::DB_FILE))
    } else {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (dir, path.clone())
    };
    anyhow::ensure!(
        file.is_file(),
        "--from: no SQLite store at {} (give the data dir the server used, or its trigger-bridge.db)",
        file.display()
    );
    Ok((dir, file))
}

/// Checks `--to` names PostgreSQL. Errors: any other scheme.
pub fn target_url(to: &str) -> anyhow::Result<&str> {
    anyhow::ensure!(
        to.starts_with("postgres://") || to.starts_with("postgresql://"),
        "--to: expected a postgres:// URL, got {}",
        redact(to)
    );
    Ok(to)
}

/// `url` with its password, if any, replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((auth, host)) = rest.split_once('@') else {
        return url.to_string();
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// Progress on stderr: one redrawn bar per table on a terminal (`rows done / total`), plain lines
/// otherwise (a table's start, each tenth of it, its end).
pub struct ProgressView {
    out: Box<dyn Write + Send>,
    tty: bool,
    tenth: u64,
}

/// Width of the bar, in characters.
const BAR: usize = 30;

impl ProgressView {
    /// On stderr, a bar when stderr is a terminal.
    pub fn stderr() -> ProgressView {
        let tty = std::io::stderr().is_terminal();
        ProgressView::new(Box::new(std::io::stderr()), tty)
    }

    /// On `out`; `tty` chooses the redrawn bar over plain lines.
    pub fn new(out: Box<dyn Write + Send>, tty: bool) -> ProgressView {
        ProgressView { out, tty, tenth: 0 }
    }

    /// Shows one report. Write errors are ignored (progress is a courtesy).
    pub fn show(&mut self, p: Progress<'_>) {
        let _ = if self.tty { self.bar(p) } else { self.line(p) };
    }

    fn bar(&mut self, p: Progress<'_>) -> std::io::Result<()> {
        let filled = if p.total == 0 {
            BAR
        } else {
            (p.done.min(p.total) as u128 * BAR as u128 / p.total as u128) as usize
        };
        write!(
            self.out,
            "\r{:<22} [{}{}] {}/{} rows",
            p.table,
            "#".repeat(filled),
            " ".repeat(BAR - filled),
            p.done,
            p.total
        )?;
        if p.done >= p.total {
            writeln!(self.out)?;
        }
        self.out.flush()
    }

    fn line(&mut self, p: Progress<'_>) -> std::io::Result<()> {
        if p.done == 0 {
            self.tenth = 0;
            if p.total > 0 {
                writeln!(self.out, "{}: 0/{} rows", p.table, p.total)?;
            }
        }
        if p.done >= p.total {
            return writeln!(self.out, "{}: {}/{} rows, done", p.table, p.done, p.total);
        }
        let tenth = p.done * 10 / p.total.max(1);
        if tenth > self.tenth {
            self.tenth = tenth;
            writeln!(self.out, "{}: {}/{} rows", p.table, p.done, p.total)?;
        }
        Ok(())
    }
}

/// The verification table: per table, source rows, target rows and `MISMATCH` where they differ,
/// then the totals, then the values counted inside rows ([`CopyReport::values`]: `receipts.body`, the
/// receipts holding a raw body), marked the same way.
pub fn counts_table(report: &CopyReport) -> String {
    let mut s = format!("{:<22} {:>12} {:>12}\n", "table", "source", "target");
    for t in &report.tables {
        let mark = if t.matches() { "" } else { "  MISMATCH" };
        s.push_str(&format!(
            "{:<22} {:>12} {:>12}{mark}\n",
            t.table, t.source, t.target
        ));
    }
    let source: u64 = report.tables.iter().map(|t| t.source).sum();
    s.push_str(&format!(
        "{:<22} {:>12} {:>12}\n",
        "total",
        source,
        report.rows()
    ));
    // Values carried inside the rows above (not rows themselves, so after the total).
    for t in &report.values {
        let mark = if t.matches() { "" } else { "  MISMATCH" };
        s.push_str(&format!(
            "{:<22} {:>12} {:>12}{mark}\n",
            t.table, t.source, t.target
        ));
    }
    s
}

/// `Ok` when every table has as many rows in the target as in the source, and every counted value
/// ([`CopyReport::values`]) as many values. Errors: names each table (or `table.column`) that differs
/// with both counts.
pub fn check(report: &CopyReport) -> anyhow::Result<()> {
    let bad = report.mismatches();
    if bad.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = bad
        .iter()
        .map(|t| format!("{} (source {}, target {})", t.table, t.source, t.target))
        .collect();
    anyhow::bail!(
        "the copy is incomplete: {} table(s) differ: {}",
        bad.len(),
        list.join(", ")
    )
}

/// Runs the copy: locks the source's data dir (refused while a server holds it), opens the source
/// (refused unless at this build's newest schema; it is not migrated), connects to the target
/// (migrating it), copies with progress on stderr, prints the counts on stdout. Errors: a bad
/// `--from`/`--to`, a held data dir, a refused copy (schema versions, schemas that differ, a non-empty
/// target without `--force`), a database error, or counts that differ after the copy.
pub async fn run(args: CopyArgs) -> anyhow::Result<()> {
    let from = args
        .from
        .as_deref()
        .context("--from sqlite:PATH is required")?;
    let to = target_url(
        args.to
            .as_deref()
            .context("--to postgres://URL is required")?,
    )?;
    let (dir, file) = source_paths(from)?;
    let _lock = crate::data_lock::acquire(&dir)
        .context("the source store must not be in use: stop the server on it before copying")?;
    let source = copy::open_source(&file)?;
    let target = PgStore::connect(
        to,
        PoolOptions {
            connections: 2,
            ..PoolOptions::default()
        },
    )
    .await
    .with_context(|| format!("cannot open the target {}", redact(to)))?;
    eprintln!("copying {} into {}", file.display(), redact(to));
    let opts = CopyOptions {
        force: args.force,
        batch_rows: args.batch_rows,
        ..CopyOptions::default()
    };
    let mut view = ProgressView::stderr();
    let result = copy::copy(&source, &target, opts, &mut |p| view.show(p)).await;
    source.close().await;
    target.close().await;
    let report = result?;
    if report.truncated {
        eprintln!("the target held rows: every table was emptied first (--force)");
    }
    for (seq, next) in &report.sequences {
        eprintln!("sequence {seq} continues at {next}");
    }
    print!("{}", counts_table(&report));
    check(&report)?;
    println!(
        "copied {} rows in {} tables; point the servers at the PostgreSQL store",
        report.rows(),
        report.tables.len()
    );
    Ok(())
}
