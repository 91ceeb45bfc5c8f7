//! The copy's data access, against [`Db`] on both sides: a batch of source rows in key order, one
//! multi-row `INSERT` per batch on the target, row counts, the emptiness check, `TRUNCATE` and the
//! target's sequences. Every statement is built from the [`Table`] the catalogs gave.

use super::schema::{quote, Table};
use crate::sql::{Db, Param, Row, Value};
use crate::{StoreError, StoreResult};

/// Most parameters one PostgreSQL statement may carry (the protocol counts them in 16 bits).
pub const MAX_PARAMS: usize = 65_535;

fn column_list(t: &Table) -> String {
    t.columns
        .iter()
        .map(|c| quote(&c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The source expressions rows are ordered by: the primary key's columns, or `rowid` when the table has
/// no primary key (read as one extra, last, column).
fn key_exprs(t: &Table) -> Vec<String> {
    if t.key.is_empty() {
        vec!["rowid".to_string()]
    } else {
        t.key.iter().map(|&i| quote(&t.columns[i].name)).collect()
    }
}

/// The values of a row's key, to resume after it: `(key values)` from a row [`read_batch`] returned.
pub fn key_of(t: &Table, r: &Row) -> Vec<Value> {
    if t.key.is_empty() {
        vec![r.0[t.columns.len()].clone()]
    } else {
        t.key.iter().map(|&i| r.0[i].clone()).collect()
    }
}

fn as_param(v: &Value) -> Param<'_> {
    match v {
        Value::Null => Param::Null,
        Value::Int(i) => Param::Int(*i),
        Value::Real(f) => Param::Real(*f),
        Value::Text(s) => Param::Text(s),
        Value::Blob(b) => Param::Blob(b),
    }
}

/// Up to `limit` source rows of `t` whose key comes after `after` (from the first row when `None`), in
/// key order. Each row holds the table's columns in order (plus the `rowid` when it has no key).
/// Errors: typed by the source backend.
pub fn read_batch(
    c: &dyn Db,
    t: &Table,
    after: Option<&[Value]>,
    limit: usize,
) -> StoreResult<Vec<Row>> {
    let keys = key_exprs(t);
    let mut select = column_list(t);
    if t.key.is_empty() {
        select.push_str(", rowid");
    }
    let order = keys.join(", ");
    let mut params: Vec<Param<'_>> = Vec::with_capacity(keys.len() + 1);
    let filter = match after {
        None => String::new(),
        Some(vals) => {
            params.extend(vals.iter().map(as_param));
            let holders: Vec<String> = (1..=vals.len()).map(|i| format!("?{i}")).collect();
            format!(" WHERE ({}) > ({})", keys.join(", "), holders.join(", "))
        }
    };
    params.push(Param::Int(i64::try_from(limit).unwrap_or(i64::MAX)));
    let sql = format!(
        "SELECT {select} FROM {}{filter} ORDER BY {order} LIMIT ?{}",
        quote(&t.name),
        params.len()
    );
    c.query(&sql, &params)
}

/// The bytes a batch holds (text and blob lengths, 8 per other value): what bounds a batch's memory.
pub fn batch_bytes(rows: &[Row]) -> usize {
    rows.iter()
        .flat_map(|r| r.0.iter())
        .map(|v| match v {
            Value::Text(s) => s.len(),
            Value::Blob(b) => b.len(),
            _ => 8,
        })
        .sum()
}

/// A source value as the parameter for a target column of type `pg_type`: text into a `bytea` column
/// goes as its UTF-8 bytes, bytes into a text column as text when they are UTF-8; everything else as
/// it is, and the target checks it. Errors: a value the column cannot hold, naming table and column.
fn bind<'v>(t: &Table, col: usize, v: &'v Value) -> StoreResult<Param<'v>> {
    let c = &t.columns[col];
    let refused = |what: &str| {
        StoreError::Database(format!(
            "cannot copy {what} into {}.{} ({})",
            t.name, c.name, c.pg_type
        ))
    };
    Ok(match (v, c.pg_type.as_str()) {
        (Value::Text(s), "bytea") => Param::Blob(s.as_bytes()),
        (Value::Blob(b), "text" | "character varying" | "character") => {
            Param::Text(std::str::from_utf8(b).map_err(|_| refused("bytes that are not UTF-8"))?)
        }
        (Value::Text(_) | Value::Blob(_) | Value::Real(_), "bigint" | "integer" | "smallint") => {
            return Err(refused("a value that is not an integer"))
        }
        (Value::Int(_) | Value::Real(_), "text" | "bytea") => return Err(refused("a number")),
        _ => as_param(v),
    })
}

/// Writes `rows` (from [`read_batch`]) into the target's `t`, as few multi-row `INSERT`s as the
/// parameter limit allows ([`MAX_PARAMS`]), inside the caller's transaction. Explicit values go into an
/// identity column too (`OVERRIDING SYSTEM VALUE`). Returns the rows inserted. Errors: a value the
/// column cannot hold (see `bind`), a constraint the row breaks (e.g. a key already in the target),
/// typed by the target backend.
pub fn insert_batch(c: &dyn Db, t: &Table, rows: &[Row]) -> StoreResult<u64> {
    let ncols = t.columns.len();
    if ncols == 0 || rows.is_empty() {
        return Ok(0);
    }
    let per_statement = (MAX_PARAMS / ncols).max(1);
    let overriding = if t.always_identity {
        " OVERRIDING SYSTEM VALUE"
    } else {
        ""
    };
    let mut written = 0;
    for chunk in rows.chunks(per_statement) {
        let mut params = Vec::with_capacity(chunk.len() * ncols);
        let mut tuples = Vec::with_capacity(chunk.len());
        for r in chunk {
            let base = params.len();
            for col in 0..ncols {
                params.push(bind(t, col, &r.0[col])?);
            }
            let holders: Vec<String> = (1..=ncols).map(|i| format!("?{}", base + i)).collect();
            tuples.push(format!("({})", holders.join(", ")));
        }
        let sql = format!(
            "INSERT INTO {} ({}){overriding} VALUES {}",
            quote(&t.name),
            column_list(t),
            tuples.join(", ")
        );
        written += c.exec(&sql, &params)?;
    }
    Ok(written)
}

/// The number of rows of `table`.
pub fn count(c: &dyn Db, table: &str) -> StoreResult<u64> {
    let n: i64 = c
        .value(
            &format!("SELECT COUNT(*) FROM {}", quote(table)),
            crate::p![],
        )?
        .unwrap_or(0);
    Ok(n.max(0) as u64)
}

/// The number of rows of `table` whose `column` is not `NULL`.
pub fn count_values(c: &dyn Db, table: &str, column: &str) -> StoreResult<u64> {
    let n: i64 = c
        .value(
            &format!(
                "SELECT COUNT(*) FROM {} WHERE {} IS NOT NULL",
                quote(table),
                quote(column)
            ),
            crate::p![],
        )?
        .unwrap_or(0);
    Ok(n.max(0) as u64)
}

/// Tables a migration fills with their initial rows (the change-log counter,
/// `migrations/*/0010_config_sync.sql`): they count as empty with only those rows, and the copy replaces
/// them with the source's ([`clear_seeded`]).
pub const SEEDED: &[&str] = &["config_change_seq", "audit_head"];

/// Deletes the migration-seeded rows of the [`SEEDED`] tables among `tables` on the target, so the
/// source's rows take their place.
pub fn clear_seeded(c: &dyn Db, tables: &[Table]) -> StoreResult<()> {
    for t in tables.iter().filter(|t| SEEDED.contains(&t.name.as_str())) {
        c.exec(&format!("DELETE FROM {}", quote(&t.name)), crate::p![])?;
    }
    Ok(())
}

/// The first of `tables` (in order) that holds a row, if any; a [`SEEDED`] table counts as empty
/// (whatever it holds is the migration's or is replaced by the copy).
pub fn first_non_empty(c: &dyn Db, tables: &[Table]) -> StoreResult<Option<String>> {
    for t in tables.iter().filter(|t| !SEEDED.contains(&t.name.as_str())) {
        let sql = format!("SELECT 1 FROM {} LIMIT 1", quote(&t.name));
        if !c.query(&sql, crate::p![])?.is_empty() {
            return Ok(Some(t.name.clone()));
        }
    }
    Ok(None)
}

/// Empties every one of `tables` on the target in one statement (`TRUNCATE ... RESTART IDENTITY`: the
/// sequences of their columns start over too); the migrations table is never among them.
pub fn truncate(c: &dyn Db, tables: &[Table]) -> StoreResult<()> {
    if tables.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = tables.iter().map(|t| quote(&t.name)).collect();
    c.exec(
        &format!("TRUNCATE TABLE {} RESTART IDENTITY", names.join(", ")),
        crate::p![],
    )?;
    Ok(())
}

/// A target sequence that feeds a column (`serial`, `bigserial`, identity): `(table, column, sequence)`.
pub fn target_sequences(c: &dyn Db) -> StoreResult<Vec<(String, String, String)>> {
    c.rows(
        // From the catalog, by dependency (serial: `a`, identity: `i`), and only for this schema's
        // tables: `pg_get_serial_sequence` over `information_schema.columns` may be evaluated on rows of
        // other schemas before the filter and fail on a relation it cannot name (or one being dropped).
        "SELECT t.relname::TEXT, a.attname::TEXT, (quote_ident(n.nspname) || '.' || quote_ident(s.relname))::TEXT \
         FROM pg_depend d \
         JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' \
         JOIN pg_class t ON t.oid = d.refobjid \
         JOIN pg_namespace n ON n.oid = t.relnamespace \
         JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = d.refobjsubid \
         WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass \
           AND d.deptype IN ('a', 'i') AND n.nspname = current_schema() \
         ORDER BY 1, 2",
        crate::p![],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
}

/// The highest value SQLite handed out to `table`'s `AUTOINCREMENT` key (`sqlite_sequence`), which may
/// exceed the largest key still present (rows deleted since); `None` when SQLite keeps none.
pub fn source_autoincrement(c: &dyn Db, table: &str) -> StoreResult<Option<i64>> {
    let has: Option<i64> = c.value(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sqlite_sequence'",
        crate::p![],
    )?;
    if has.is_none() {
        return Ok(None);
    }
    c.value(
        "SELECT seq FROM sqlite_sequence WHERE name = ?1",
        crate::p![table],
    )
}

/// The largest value of `table.column` on the target (`None` when the table is empty).
pub fn max_value(c: &dyn Db, table: &str, column: &str) -> StoreResult<Option<i64>> {
    let v: Option<Option<i64>> = c.value(
        &format!(
            "SELECT CAST(MAX({}) AS BIGINT) FROM {}",
            quote(column),
            quote(table)
        ),
        crate::p![],
    )?;
    Ok(v.flatten())
}

/// Sets `sequence` so its next value is `next` (`setval(seq, next, false)`).
pub fn set_next(c: &dyn Db, sequence: &str, next: i64) -> StoreResult<()> {
    c.query(
        "SELECT setval(CAST(?1 AS TEXT)::regclass, ?2, false)",
        crate::p![sequence, next],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::schema::Column;
    use super::*;

    fn table(cols: &[(&str, &str)], key: Vec<usize>) -> Table {
        Table {
            name: "t".into(),
            columns: cols
                .iter()
                .map(|(n, ty)| Column {
                    name: n.to_string(),
                    pg_type: ty.to_string(),
                })
                .collect(),
            key,
            always_identity: false,
        }
    }

    #[test]
    fn values_bind_to_the_target_column_type() {
        let t = table(
            &[("id", "text"), ("body", "bytea"), ("n", "bigint")],
            vec![0],
        );
        let text = Value::Text("é".into());
        assert_eq!(bind(&t, 1, &text).unwrap(), Param::Blob("é".as_bytes()));
        let utf8 = Value::Blob(b"ok".to_vec());
        assert_eq!(bind(&t, 0, &utf8).unwrap(), Param::Text("ok"));
        let bin = Value::Blob(vec![0xff, 0x00]);
        assert_eq!(bind(&t, 1, &bin).unwrap(), Param::Blob(&[0xff, 0x00]));
        let e = bind(&t, 0, &bin).unwrap_err().to_string();
        assert!(
            e.contains("cannot copy bytes that are not UTF-8 into t.id (text)"),
            "{e}"
        );
        let e = bind(&t, 2, &text).unwrap_err().to_string();
        assert!(e.contains("t.n (bigint)"), "{e}");
        assert_eq!(bind(&t, 2, &Value::Null).unwrap(), Param::Null);
    }

    #[test]
    fn a_keyless_table_is_walked_by_rowid() {
        let t = table(&[("a", "text")], vec![]);
        assert_eq!(key_exprs(&t), vec!["rowid".to_string()]);
        let r = Row(vec![Value::Text("x".into()), Value::Int(7)]);
        assert_eq!(key_of(&t, &r), vec![Value::Int(7)]);
        let t = table(&[("a", "text"), ("b", "bigint")], vec![1, 0]);
        let r = Row(vec![Value::Text("x".into()), Value::Int(7)]);
        assert_eq!(key_of(&t, &r), vec![Value::Int(7), Value::Text("x".into())]);
    }
}
