//! Copying a whole store from SQLite to PostgreSQL, once, when moving from one process to replicas
//! (`trigger-bridge migrate --from sqlite:DIR --to postgres://...`; docs/operations.md, "Moving from
//! SQLite to PostgreSQL").
//!
//! Generic over the schema: the tables and columns come from each database's catalog
//! ([`schema::plan`]) and must agree, so a migration that adds a table or column needs no change here.
//! Both sides go through the shared [`Db`](crate::sql::Db) interface: the source is read through
//! [`SqliteStore`]'s read connections, the target written through [`PgStore`]'s pool. The copy:
//!
//! 1. checks that both stores are at this build's newest schema version and that their schemas agree;
//! 2. refuses a target holding any row, naming the first non-empty table, unless
//!    [`CopyOptions::force`]: then it empties every table of the target first (one `TRUNCATE`);
//! 3. copies table by table, in key order, in batches of at most [`CopyOptions::batch_rows`] rows and
//!    about [`CopyOptions::batch_bytes`] bytes, each batch one target transaction (reading the next batch
//!    while the last is written), reporting [`Progress`] after each;
//! 4. moves every target sequence past the keys copied (and past SQLite's `AUTOINCREMENT` high-water
//!    mark), so the target continues without id clashes;
//! 5. counts every table on both sides ([`CopyReport::tables`]), and the values that travel inside
//!    another table's rows ([`COUNTED_VALUES`]: the receipts' raw bodies) on both sides
//!    ([`CopyReport::values`]).
//!
//! It is not one transaction: an interrupted copy leaves a partly filled target, which a new copy with
//! `force` replaces. Nothing may write to the source meanwhile (the CLI holds the data dir lock).

pub mod rows;
pub mod schema;

use std::path::Path;
use std::sync::Arc;

use crate::postgres::PgStore;
use crate::sql::{Backend, Row, Value};
use crate::sqlite::SqliteStore;
use crate::StoreError;
use schema::Table;

/// Default most rows per batch (one target transaction).
pub const DEFAULT_BATCH_ROWS: usize = 1_000;

/// Default bytes a batch aims at (8 MiB): a table of large rows (raw bodies) is copied in smaller
/// batches so memory stays bounded.
pub const DEFAULT_BATCH_BYTES: usize = 8 << 20;

/// Rows of a table's first batch, before its row size is known.
const FIRST_BATCH_ROWS: usize = 16;

/// Settings of [`copy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Empty every table of a non-empty target first instead of refusing it.
    pub force: bool,
    /// Most rows per batch (at least 1). Default [`DEFAULT_BATCH_ROWS`].
    pub batch_rows: usize,
    /// Bytes a batch aims at (text and blob lengths); the next batch's row count follows the last
    /// batch's average row size. Default [`DEFAULT_BATCH_BYTES`].
    pub batch_bytes: usize,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            force: false,
            batch_rows: DEFAULT_BATCH_ROWS,
            batch_bytes: DEFAULT_BATCH_BYTES,
        }
    }
}

/// Where the copy of one table stands: `done` of `total` source rows written. Reported once before a
/// table's first batch (`done == 0`) and after each batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<'a> {
    /// The table.
    pub table: &'a str,
    /// Rows written so far.
    pub done: u64,
    /// Rows the source holds.
    pub total: u64,
}

/// Columns whose non-`NULL` values [`verify`] counts on both sides besides the rows, as
/// `(table, column)`: a receipt's raw body is its row's `body` column (SQLite migration 0021,
/// PostgreSQL 0015; before, a `bodies` table of its own), `NULL` when empty or swept, so the receipts'
/// row count alone would not show a body lost on the way.
pub const COUNTED_VALUES: &[(&str, &str)] = &[("receipts", "body")];

/// One table's rows on each side after the copy (or, in [`CopyReport::values`], one column's
/// non-`NULL` values, named `table.column`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCount {
    /// The table.
    pub table: String,
    /// Rows in the source.
    pub source: u64,
    /// Rows in the target.
    pub target: u64,
}

impl TableCount {
    /// Whether both sides hold the same number of rows.
    pub fn matches(&self) -> bool {
        self.source == self.target
    }
}

/// What [`copy`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// Every table, in copy order (by name), with its counts on both sides.
    pub tables: Vec<TableCount>,
    /// The non-`NULL` values of each of [`COUNTED_VALUES`] on both sides, named `table.column`
    /// (`receipts.body`: the receipts holding a raw body). Not rows: [`CopyReport::rows`] leaves them out.
    pub values: Vec<TableCount>,
    /// Whether the target was emptied first ([`CopyOptions::force`] on a non-empty target).
    pub truncated: bool,
    /// The target sequences moved on: `(sequence, next value)`.
    pub sequences: Vec<(String, i64)>,
}

impl CopyReport {
    /// The tables (and [`CopyReport::values`]) whose counts differ.
    pub fn mismatches(&self) -> Vec<&TableCount> {
        self.tables
            .iter()
            .chain(&self.values)
            .filter(|t| !t.matches())
            .collect()
    }

    /// Rows copied in all.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.target).sum()
    }
}

/// Why a copy did not start or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// No SQLite store at the path.
    #[error("no SQLite store at {0}")]
    NoSource(String),
    /// A store is not at this build's newest schema version.
    #[error(
        "the {side} store is at schema version {found}, this build's newest is {newest}: {advice}"
    )]
    Version {
        /// `source` or `target`.
        side: &'static str,
        /// The version it is at.
        found: i64,
        /// This build's newest.
        newest: i64,
        /// What to do.
        advice: &'static str,
    },
    /// The two schemas differ (one line per difference).
    #[error("the source and target schemas differ: {}", .0.join("; "))]
    SchemaMismatch(Vec<String>),
    /// The target holds rows and `force` was not given.
    #[error(
        "the target is not empty: table {0} has rows; copy into an empty database, or pass --force \
         to empty every table of the target first"
    )]
    TargetNotEmpty(String),
    /// A database error on either side.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The schema version of the SQLite database file at `path`, read without changing it (a read-only
/// connection). Errors: no such file (`NoSource`), not a database (`Store`).
pub fn source_file_version(path: &Path) -> Result<i64, CopyError> {
    if !path.is_file() {
        return Err(CopyError::NoSource(path.display().to_string()));
    }
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Database(format!("cannot open {}: {e}", path.display())))?;
    Ok(schema::source_version(&conn)?)
}

/// Opens the SQLite store at `path` (its database file) as the copy's source: refused, before anything
/// is written to it, unless it exists and is at [`crate::sqlite::SCHEMA_VERSION`] (opening a store
/// migrates it; a copy must not). Errors: `NoSource`, `Version`, `Store`.
pub fn open_source(path: &Path) -> Result<SqliteStore, CopyError> {
    let found = source_file_version(path)?;
    let newest = crate::sqlite::SCHEMA_VERSION;
    if found != newest {
        return Err(CopyError::Version {
            side: "source",
            found,
            newest,
            advice: if found < newest {
                "run `trigger-bridge migrate --data-dir <its data dir>` first"
            } else {
                "use the trigger-bridge release that wrote it"
            },
        });
    }
    Ok(SqliteStore::open(path)?)
}

/// Copies every table of `source` into `target` (see the module documentation for the steps), calling
/// `progress` as it goes. Errors: `Version` (either store not at this build's newest version),
/// `SchemaMismatch`, `TargetNotEmpty` (without `force`), `Store` (a database error; the target may be
/// partly filled). Count mismatches are no error: see [`CopyReport::mismatches`].
pub async fn copy(
    source: &SqliteStore,
    target: &PgStore,
    opts: CopyOptions,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<CopyReport, CopyError> {
    let dst = target.backend();
    check_versions(source, target).await?;
    let tables = plan(source, target).await?;
    let shared = Arc::new(tables.clone());
    let non_empty = {
        let t = shared.clone();
        dst.read(move |c| rows::first_non_empty(c, &t)).await?
    };
    let truncated = match non_empty {
        Some(table) if !opts.force => return Err(CopyError::TargetNotEmpty(table)),
        Some(_) => {
            let t = shared.clone();
            dst.write(move |c| rows::truncate(c, &t)).await?;
            true
        }
        None => false,
    };
    if !truncated {
        let t = shared.clone();
        dst.write(move |c| rows::clear_seeded(c, &t)).await?;
    }
    for t in &tables {
        copy_table(source, target, t, opts, progress).await?;
    }
    let sequences = carry_sequences(source, target).await?;
    let counts = verify(source, target, &tables).await?;
    let values = verify_values(source, target, &tables).await?;
    Ok(CopyReport {
        tables: counts,
        values,
        truncated,
        sequences,
    })
}

/// Both stores at this build's newest version: SQLite's `user_version` and PostgreSQL's
/// `schema_migrations`.
async fn check_versions(source: &SqliteStore, target: &PgStore) -> Result<(), CopyError> {
    let found = source.backend().read(|c| schema::source_version(c)).await?;
    let newest = crate::sqlite::SCHEMA_VERSION;
    if found != newest {
        return Err(CopyError::Version {
            side: "source",
            found,
            newest,
            advice: "run `trigger-bridge migrate` on it first",
        });
    }
    let found = target.backend().read(|c| schema::target_version(c)).await?;
    let newest = crate::postgres::MIGRATIONS.last().map_or(0, |m| m.0);
    if found != newest {
        return Err(CopyError::Version {
            side: "target",
            found,
            newest,
            advice: if found < newest {
                "connecting this build's PgStore to it migrates it"
            } else {
                "it was migrated by a newer trigger-bridge; copy with that release"
            },
        });
    }
    Ok(())
}

/// The tables to copy, from both catalogs ([`schema::plan`]).
pub async fn plan(source: &SqliteStore, target: &PgStore) -> Result<Vec<Table>, CopyError> {
    let s = source.backend().read(|c| schema::read_source(c)).await?;
    let t = target.backend().read(|c| schema::read_target(c)).await?;
    schema::plan(&s, &t).map_err(CopyError::SchemaMismatch)
}

async fn read_next(
    source: &SqliteStore,
    t: &Arc<Table>,
    after: Option<Vec<Value>>,
    limit: usize,
) -> Result<Vec<Row>, CopyError> {
    let t = t.clone();
    Ok(source
        .backend()
        .read(move |c| rows::read_batch(c, &t, after.as_deref(), limit))
        .await?)
}

async fn write_batch(target: &PgStore, t: &Arc<Table>, batch: Vec<Row>) -> Result<u64, CopyError> {
    let t = t.clone();
    Ok(target
        .backend()
        .write(move |c| rows::insert_batch(c, &t, &batch))
        .await?)
}

/// The next batch's row count: the batch budget over the last batch's average row size, within
/// `1..=batch_rows`.
fn next_limit(opts: CopyOptions, rows: usize, bytes: usize) -> usize {
    let max = opts.batch_rows.max(1);
    if rows == 0 || bytes == 0 {
        return max;
    }
    let per_row = bytes.div_ceil(rows);
    (opts.batch_bytes / per_row).clamp(1, max)
}

/// Copies one table in key order; the next batch is read while the last one is written.
async fn copy_table(
    source: &SqliteStore,
    target: &PgStore,
    t: &Table,
    opts: CopyOptions,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<(), CopyError> {
    let name = t.name.clone();
    let total = source
        .backend()
        .read(move |c| rows::count(c, &name))
        .await?;
    progress(Progress {
        table: &t.name,
        done: 0,
        total,
    });
    let t = Arc::new(t.clone());
    let mut limit = FIRST_BATCH_ROWS.min(opts.batch_rows.max(1));
    let mut batch = read_next(source, &t, None, limit).await?;
    let mut done = 0u64;
    while !batch.is_empty() {
        let more = batch.len() == limit;
        let after = rows::key_of(&t, batch.last().expect("non-empty"));
        let n = batch.len() as u64;
        limit = next_limit(opts, batch.len(), rows::batch_bytes(&batch));
        let next = if more {
            let (w, r) = tokio::join!(
                write_batch(target, &t, batch),
                read_next(source, &t, Some(after), limit)
            );
            w?;
            r?
        } else {
            write_batch(target, &t, batch).await?;
            Vec::new()
        };
        done += n;
        progress(Progress {
            table: &t.name,
            done,
            total,
        });
        batch = next;
    }
    Ok(())
}

/// Moves each target sequence to one past the largest key copied into its column (or past SQLite's
/// `AUTOINCREMENT` high-water mark for that table, when higher). Returns `(sequence, next value)`.
async fn carry_sequences(
    source: &SqliteStore,
    target: &PgStore,
) -> Result<Vec<(String, i64)>, CopyError> {
    let seqs = target.backend().read(rows::target_sequences).await?;
    let mut out = Vec::new();
    for (table, column, seq) in seqs {
        let t = table.clone();
        let src_high = source
            .backend()
            .read(move |c| rows::source_autoincrement(c, &t))
            .await?;
        let (t, col) = (table.clone(), column.clone());
        let dst_high = target
            .backend()
            .read(move |c| rows::max_value(c, &t, &col))
            .await?;
        let Some(high) = src_high.max(dst_high) else {
            continue;
        };
        let next = high.saturating_add(1);
        let s = seq.clone();
        target
            .backend()
            .write(move |c| rows::set_next(c, &s, next))
            .await?;
        out.push((seq, next));
    }
    Ok(out)
}

/// Counts every one of `tables` on both sides, in order.
pub async fn verify(
    source: &SqliteStore,
    target: &PgStore,
    tables: &[Table],
) -> Result<Vec<TableCount>, CopyError> {
    let names: Vec<String> = tables.iter().map(|t| t.name.clone()).collect();
    let n = names.clone();
    let src = source
        .backend()
        .read(move |c| {
            n.iter()
                .map(|t| rows::count(c, t))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    let n = names.clone();
    let dst = target
        .backend()
        .read(move |c| {
            n.iter()
                .map(|t| rows::count(c, t))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    Ok(names
        .into_iter()
        .zip(src.into_iter().zip(dst))
        .map(|(table, (source, target))| TableCount {
            table,
            source,
            target,
        })
        .collect())
}

/// Counts the non-`NULL` values of each of [`COUNTED_VALUES`] whose table is among `tables`, on both
/// sides, named `table.column`.
pub async fn verify_values(
    source: &SqliteStore,
    target: &PgStore,
    tables: &[Table],
) -> Result<Vec<TableCount>, CopyError> {
    let cols: Vec<(String, String)> = COUNTED_VALUES
        .iter()
        .filter(|(t, c)| {
            tables
                .iter()
                .any(|x| x.name == *t && x.columns.iter().any(|col| col.name == *c))
        })
        .map(|(t, c)| (t.to_string(), c.to_string()))
        .collect();
    let count_all = |cols: Vec<(String, String)>| {
        move |c: &dyn crate::sql::Db| {
            cols.iter()
                .map(|(t, col)| rows::count_values(c, t, col))
                .collect::<Result<Vec<_>, _>>()
        }
    };
    let src = source.backend().read(count_all(cols.clone())).await?;
    let dst = target.backend().read(count_all(cols.clone())).await?;
    Ok(cols
        .into_iter()
        .zip(src.into_iter().zip(dst))
        .map(|((t, col), (source, target))| TableCount {
            table: format!("{t}.{col}"),
            source,
            target,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_follow_the_row_size_within_bounds() {
        let opts = CopyOptions {
            force: false,
            batch_rows: 1_000,
            batch_bytes: 1 << 20,
        };
        assert_eq!(
            next_limit(opts, 16, 16 * 100),
            1_000,
            "small rows: full batches"
        );
        assert_eq!(
            next_limit(opts, 16, 16 * 64 * 1024),
            16,
            "64 KiB rows: 1 MiB / 64 KiB"
        );
        assert_eq!(
            next_limit(opts, 2, 2 * (4 << 20)),
            1,
            "rows over the budget: one at a time"
        );
        assert_eq!(next_limit(opts, 0, 0), 1_000);
    }
}
