//! The copy's plan: the tables and columns of both stores, read from each database's catalog and
//! compared, so the copy follows whatever the migrations made (a table or column added by a migration is
//! copied without a change here) and refuses stores whose schemas differ.

use crate::sql::Db;
use crate::{StoreError, StoreResult};

/// PostgreSQL's own bookkeeping table (`postgres::migrate`): never copied, never compared.
pub const PG_MIGRATIONS_TABLE: &str = "schema_migrations";

/// One column as the target declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Its name (the same on both sides).
    pub name: String,
    /// The target's type as `information_schema.columns.data_type` names it (`bigint`, `text`, `bytea`).
    pub pg_type: String,
}

/// One table to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Its name (the same on both sides).
    pub name: String,
    /// Its columns, in declaration order (the same order on both sides).
    pub columns: Vec<Column>,
    /// The source's primary-key columns, in key order, as indexes into `columns`; empty when the table
    /// has none (then the source is walked by SQLite's `rowid`).
    pub key: Vec<usize>,
    /// Whether the target has a `GENERATED ALWAYS` identity column, whose explicit values an `INSERT`
    /// takes only with `OVERRIDING SYSTEM VALUE`.
    pub always_identity: bool,
}

/// SQL identifier quoting, the same in both dialects: `"name"`, an inner `"` doubled.
pub fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A source column as SQLite's catalog gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceColumn {
    /// Its name.
    pub name: String,
    /// Its declared type (`INTEGER`, `TEXT`, `BLOB`, or anything SQLite took).
    pub declared: String,
    /// Its position in the primary key, from 1; 0 when not in it.
    pub pk: i64,
}

/// A source table: its name and its columns in declaration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTable {
    /// Its name.
    pub name: String,
    /// Its columns, in order.
    pub columns: Vec<SourceColumn>,
}

/// The source's tables (every table but SQLite's internal `sqlite_*` ones), by name, with their
/// columns: what [`plan`] takes.
pub fn read_source(c: &dyn Db) -> StoreResult<Vec<SourceTable>> {
    let names: Vec<String> = c.rows(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
         ORDER BY name",
        crate::p![],
        |r| r.get(0),
    )?;
    names
        .into_iter()
        .map(|name| {
            let columns = c.rows(
                "SELECT name, type, pk FROM pragma_table_info(?1) ORDER BY cid",
                crate::p![name],
                |r| {
                    Ok(SourceColumn {
                        name: r.get(0)?,
                        declared: r.get(1)?,
                        pk: r.get(2)?,
                    })
                },
            )?;
            Ok(SourceTable { name, columns })
        })
        .collect()
}

/// A target column: table, name, type, whether it is a `GENERATED ALWAYS` identity.
type TargetColumn = (String, String, String, bool);

/// The target's columns of its base tables in its current schema, by table then position.
fn target_columns(c: &dyn Db) -> StoreResult<Vec<TargetColumn>> {
    c.rows(
        "SELECT c.table_name::TEXT, c.column_name::TEXT, c.data_type::TEXT, \
                (c.is_identity = 'YES' AND c.identity_generation = 'ALWAYS') \
         FROM information_schema.columns c \
         JOIN information_schema.tables t \
           ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' \
           AND c.table_name::TEXT <> ?1 \
         ORDER BY c.table_name, c.ordinal_position",
        crate::p![PG_MIGRATIONS_TABLE],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<bool>(3)?)),
    )
}

/// How a value of a column is stored, coarsely: what must agree between the two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Integer,
    Real,
    Text,
    Bytes,
    /// A type the copy does not judge (SQLite `NUMERIC` affinity, a PostgreSQL type outside the
    /// store's four); the target decides when a row is written.
    Other,
}

/// SQLite's affinity of a declared type (SQLite manual, "Datatypes", §3.1), as a [`Class`].
fn sqlite_class(declared: &str) -> Class {
    let d = declared.to_ascii_uppercase();
    if d.contains("INT") {
        Class::Integer
    } else if d.contains("CHAR") || d.contains("CLOB") || d.contains("TEXT") {
        Class::Text
    } else if d.contains("BLOB") || d.is_empty() {
        Class::Bytes
    } else if d.contains("REAL") || d.contains("FLOA") || d.contains("DOUB") {
        Class::Real
    } else {
        Class::Other
    }
}

fn pg_class(data_type: &str) -> Class {
    match data_type {
        "bigint" | "integer" | "smallint" | "boolean" => Class::Integer,
        "double precision" | "real" => Class::Real,
        "text" | "character varying" | "character" | "name" => Class::Text,
        "bytea" => Class::Bytes,
        _ => Class::Other,
    }
}

/// Reads both catalogs and compares them. Tables are matched by name; each must have the same columns
/// (names, in the same order) and compatible types (SQLite `INTEGER` to `bigint`, `TEXT` to `text`,
/// `BLOB` to `bytea`, `REAL` to `double precision`). `source` is [`read_source`]'s answer, `target`
/// [`read_target`]'s. Returns the tables in the source's order (by name). Errors: one line per
/// difference (a table on one side only, columns that differ, a type that does not match).
pub fn plan(source: &[SourceTable], target: &[TargetColumn]) -> Result<Vec<Table>, Vec<String>> {
    let mut diffs = Vec::new();
    let mut by_table: std::collections::BTreeMap<&str, Vec<&TargetColumn>> = Default::default();
    for col in target {
        by_table.entry(col.0.as_str()).or_default().push(col);
    }
    let mut tables = Vec::new();
    for SourceTable {
        name,
        columns: cols,
    } in source
    {
        let Some(tcols) = by_table.remove(name.as_str()) else {
            diffs.push(format!("table {name} is in the source only"));
            continue;
        };
        let snames: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        let tnames: Vec<&str> = tcols.iter().map(|c| c.1.as_str()).collect();
        if snames != tnames {
            diffs.push(format!(
                "table {name}: source columns ({}) differ from target columns ({})",
                snames.join(", "),
                tnames.join(", ")
            ));
            continue;
        }
        for (sc, t) in cols.iter().zip(&tcols) {
            let (cname, declared) = (&sc.name, &sc.declared);
            let (s, p) = (sqlite_class(declared), pg_class(&t.2));
            if s != p && s != Class::Other && p != Class::Other {
                diffs.push(format!(
                    "column {name}.{cname}: source type {declared:?} does not match target type {}",
                    t.2
                ));
            }
        }
        let mut key: Vec<(i64, usize)> = cols
            .iter()
            .enumerate()
            .filter(|(_, c)| c.pk > 0)
            .map(|(i, c)| (c.pk, i))
            .collect();
        key.sort();
        tables.push(Table {
            name: name.clone(),
            columns: tcols
                .iter()
                .map(|c| Column {
                    name: c.1.clone(),
                    pg_type: c.2.clone(),
                })
                .collect(),
            key: key.into_iter().map(|(_, i)| i).collect(),
            always_identity: tcols.iter().any(|c| c.3),
        });
    }
    for name in by_table.keys() {
        diffs.push(format!("table {name} is in the target only"));
    }
    if diffs.is_empty() {
        Ok(tables)
    } else {
        Err(diffs)
    }
}

/// The target's catalog as [`plan`] takes it.
pub fn read_target(c: &dyn Db) -> StoreResult<Vec<TargetColumn>> {
    target_columns(c)
}

/// The schema version recorded in the source (`PRAGMA user_version`).
pub fn source_version(c: &dyn Db) -> StoreResult<i64> {
    c.value("PRAGMA user_version", crate::p![])?
        .ok_or_else(|| StoreError::Database("PRAGMA user_version returned no row".into()))
}

/// The schema version recorded in the target (`schema_migrations`; 0 before any migration).
pub fn target_version(c: &dyn Db) -> StoreResult<i64> {
    let exists: bool = c
        .value(
            "SELECT to_regclass(?1) IS NOT NULL",
            crate::p![PG_MIGRATIONS_TABLE],
        )?
        .unwrap_or(false);
    if !exists {
        return Ok(0);
    }
    Ok(c.value(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        crate::p![],
    )?
    .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(name: &str, cols: &[(&str, &str, i64)]) -> SourceTable {
        SourceTable {
            name: name.into(),
            columns: cols
                .iter()
                .map(|(n, t, k)| SourceColumn {
                    name: n.to_string(),
                    declared: t.to_string(),
                    pk: *k,
                })
                .collect(),
        }
    }

    fn tgt(table: &str, cols: &[(&str, &str)]) -> Vec<TargetColumn> {
        cols.iter()
            .map(|(n, t)| (table.to_string(), n.to_string(), t.to_string(), false))
            .collect()
    }

    #[test]
    fn matching_tables_plan_with_their_key_in_key_order() {
        let source = vec![src(
            "attempts",
            &[
                ("delivery_id", "TEXT", 1),
                ("body", "BLOB", 0),
                ("attempt", "INTEGER", 2),
            ],
        )];
        let target = tgt(
            "attempts",
            &[
                ("delivery_id", "text"),
                ("body", "bytea"),
                ("attempt", "bigint"),
            ],
        );
        let plan = plan(&source, &target).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].key, vec![0, 2]);
        assert_eq!(plan[0].columns[1].pg_type, "bytea");
        assert!(!plan[0].always_identity);
    }

    #[test]
    fn every_difference_is_named() {
        let source = vec![
            src("a", &[("id", "TEXT", 1), ("n", "INTEGER", 0)]),
            src("only_src", &[("id", "TEXT", 1)]),
            src("b", &[("id", "TEXT", 1)]),
        ];
        let mut target = tgt("a", &[("id", "text"), ("n", "text")]);
        target.extend(tgt("b", &[("id", "text"), ("extra", "bigint")]));
        target.extend(tgt("only_tgt", &[("id", "text")]));
        let diffs = plan(&source, &target).unwrap_err();
        assert_eq!(
            diffs,
            vec![
                "column a.n: source type \"INTEGER\" does not match target type text".to_string(),
                "table only_src is in the source only".to_string(),
                "table b: source columns (id) differ from target columns (id, extra)".to_string(),
                "table only_tgt is in the target only".to_string(),
            ]
        );
    }

    #[test]
    fn quoting_doubles_inner_quotes() {
        assert_eq!(quote("key"), "\"key\"");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}
