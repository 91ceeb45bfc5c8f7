//! [`Db`] over a `rusqlite::Connection`: statements are prepared once and cached by the connection.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;

use crate::sql::{Db, Dialect, Param, Row, Value};
use crate::StoreResult;

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Param::Null => ValueRef::Null,
            Param::Int(i) => ValueRef::Integer(i),
            Param::Real(f) => ValueRef::Real(f),
            Param::Text(s) => ValueRef::Text(s.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
            // SQLite has no arrays; the shared code sends it `VALUES` lists instead
            // (`crate::sql::Rows`).
            Param::Texts(_) | Param::Ints(_) | Param::Blobs(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "an array parameter is PostgreSQL only".into(),
                ))
            }
        }))
    }
}

fn value(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(f) => Value::Real(f),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

impl Db for Connection {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn exec(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        let mut st = self.prepare_cached(sql).map_err(|e| classify(&e))?;
        let n = st
            .execute(rusqlite::params_from_iter(params.iter()))
            .map_err(|e| classify(&e))?;
        Ok(n as u64)
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<Vec<Row>> {
        let mut st = self.prepare_cached(sql).map_err(|e| classify(&e))?;
        let cols = st.column_count();
        let mut rows = st
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(|e| classify(&e))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next().map_err(|e| classify(&e))? {
            let mut vals = Vec::with_capacity(cols);
            for i in 0..cols {
                vals.push(value(r.get_ref(i).map_err(|e| classify(&e))?));
            }
            out.push(Row(vals));
        }
        Ok(out)
    }
}

/// Maps a SQLite error onto a typed store error: a locked/busy database is
/// [`StoreError::Busy`](crate::StoreError::Busy) (transient: retry), a full disk or database
/// [`StoreError::Unavailable`](crate::StoreError::Unavailable), a constraint violation
/// [`StoreError::Database`](crate::StoreError::Database) naming it, anything else `Database`.
pub(crate) fn classify(e: &rusqlite::Error) -> crate::StoreError {
    use crate::StoreError;
    use rusqlite::ErrorCode as C;
    match e.sqlite_error_code() {
        Some(C::DatabaseBusy | C::DatabaseLocked) => {
            StoreError::Busy(format!("the database is locked: {e}"))
        }
        Some(C::DiskFull) => StoreError::Unavailable(format!("the disk or database is full: {e}")),
        _ => StoreError::Database(e.to_string()),
    }
}
