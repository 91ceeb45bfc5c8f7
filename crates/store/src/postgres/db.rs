//! [`Db`] over a PostgreSQL transaction: `?N` placeholders become `$N`, each statement is prepared once
//! per connection and cached by its SQL text, parameters bind to whatever type PostgreSQL inferred for
//! them, and each column converts by its type to a [`Value`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error as StdError;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql, Type};
use postgres::{Statement, Transaction};

use crate::sql::{to_postgres, Db, Dialect, Param, Row, Value};
use crate::StoreResult;

use super::error::classify;

/// Most statements one connection keeps prepared. The store's SQL is a fixed set of texts, so the cache
/// only overflows if a caller builds SQL with varying text (e.g. an `IN (...)` list of varying length);
/// then it is emptied and refilled (statements are closed on the server when dropped).
pub const STATEMENT_CACHE_CAPACITY: usize = 512;

type BoxError = Box<dyn StdError + Sync + Send>;

/// The prepared statements of one connection, by the SQL text the store wrote (with `?N`). Belongs to
/// the connection, not to a transaction: a prepared statement outlives `COMMIT` and `ROLLBACK`. Must be
/// [cleared](StatementCache::clear) when the connection is replaced.
#[derive(Default)]
pub struct StatementCache {
    map: HashMap<String, Statement>,
}

impl StatementCache {
    /// An empty cache.
    pub fn new() -> StatementCache {
        StatementCache::default()
    }

    /// Forgets every statement (after a reconnect, or when the schema changed under a cached plan).
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// How many statements are cached.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// What a [`PgDb`] sends its statements on: an open transaction, or (for a point read) the client
/// itself in autocommit, where each statement is its own snapshot and no `BEGIN`/`COMMIT` round trips
/// are paid.
pub trait PgConn {
    /// Prepares `sql` (already in PostgreSQL's `$N` form).
    fn prepare(&mut self, sql: &str) -> Result<Statement, postgres::Error>;
    /// Runs `st`; rows changed.
    fn execute(
        &mut self,
        st: &Statement,
        p: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error>;
    /// Runs `st`; every row.
    fn query(
        &mut self,
        st: &Statement,
        p: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, postgres::Error>;
}

impl PgConn for Transaction<'_> {
    fn prepare(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        Transaction::prepare(self, sql)
    }
    fn execute(
        &mut self,
        st: &Statement,
        p: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        Transaction::execute(self, st, p)
    }
    fn query(
        &mut self,
        st: &Statement,
        p: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        Transaction::query(self, st, p)
    }
}

impl PgConn for &mut postgres::Client {
    fn prepare(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        postgres::Client::prepare(self, sql)
    }
    fn execute(
        &mut self,
        st: &Statement,
        p: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        postgres::Client::execute(self, st, p)
    }
    fn query(
        &mut self,
        st: &Statement,
        p: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<postgres::Row>, postgres::Error> {
        postgres::Client::query(self, st, p)
    }
}

/// A [`Db`] over one open PostgreSQL transaction (`BEGIN` was sent; the owner commits or rolls back
/// with [`PgDb::into_transaction`]), or over a client in autocommit for a point read. Statements come
/// from, and go into, the connection's [`StatementCache`].
pub struct PgDb<'c, C: PgConn = Transaction<'c>> {
    tx: RefCell<C>,
    cache: &'c RefCell<StatementCache>,
}

impl<'c, C: PgConn> PgDb<'c, C> {
    /// Wraps an open transaction (or an autocommit client) and the cache of the connection it runs on.
    pub fn new(tx: C, cache: &'c RefCell<StatementCache>) -> PgDb<'c, C> {
        PgDb {
            tx: RefCell::new(tx),
            cache,
        }
    }

    /// The transaction (or client) back, to commit or roll back.
    pub fn into_transaction(self) -> C {
        self.tx.into_inner()
    }

    /// The prepared statement for `sql` (written with `?N`), preparing and caching it on first use.
    /// Errors: the server refused to prepare it (typed by [`classify`]).
    fn statement(&self, sql: &str) -> StoreResult<Statement> {
        if let Some(st) = self.cache.borrow().map.get(sql) {
            return Ok(st.clone());
        }
        let st = self
            .tx
            .borrow_mut()
            .prepare(&to_postgres(sql))
            .map_err(|e| classify(&e))?;
        let mut cache = self.cache.borrow_mut();
        if cache.map.len() >= STATEMENT_CACHE_CAPACITY {
            cache.map.clear();
        }
        cache.map.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    /// Types the failure of `sql`'s statement. A statement the schema changed under (a column added
    /// by a newer replica's migration: SQLSTATE `0A000` "cached plan must not change result type") is
    /// dropped from the cache and the failure is [`StoreError::Retryable`], so the transaction runs
    /// again and prepares it anew; anything else is typed by [`classify`].
    fn failed(&self, sql: &str, e: &postgres::Error) -> crate::StoreError {
        let stale = e.code() == Some(&postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
            && e.as_db_error()
                .is_some_and(|d| d.message().contains("cached plan"));
        if stale {
            self.cache.borrow_mut().map.remove(sql);
            return crate::StoreError::Retryable(format!(
                "a prepared statement went stale after a schema change: {}",
                super::error::text(e)
            ));
        }
        classify(e)
    }
}

fn bind<'p>(params: &'p [Param<'_>]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl<C: PgConn> Db for PgDb<'_, C> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn exec(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        let st = self.statement(sql)?;
        self.tx
            .borrow_mut()
            .execute(&st, &bind(params))
            .map_err(|e| self.failed(sql, &e))
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<Vec<Row>> {
        let st = self.statement(sql)?;
        let rows = self
            .tx
            .borrow_mut()
            .query(&st, &bind(params))
            .map_err(|e| self.failed(sql, &e))?;
        rows.iter().map(row).collect()
    }
}

/// Converts one PostgreSQL row. Errors: a column of a type [`Cell`] does not read (named with its
/// position and type; cast it in the SQL, e.g. `CAST(SUM(x) AS BIGINT)`, since `SUM(bigint)` is
/// `NUMERIC` in PostgreSQL).
fn row(r: &postgres::Row) -> StoreResult<Row> {
    let mut vals = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        if !Cell::accepts(col.type_()) {
            return Err(crate::StoreError::Database(format!(
                "column {i} ({}): PostgreSQL type {} has no store value; cast it to BIGINT, \
                 DOUBLE PRECISION, TEXT or BYTEA",
                col.name(),
                col.type_()
            )));
        }
        let Cell(v) = r
            .try_get::<_, Cell>(i)
            .map_err(|e| crate::StoreError::Database(format!("column {i}: {e}")))?;
        vals.push(v);
    }
    Ok(Row(vals))
}

/// One column value read by its PostgreSQL type: `INT2`/`INT4`/`INT8`/`BOOL` (0/1) as
/// [`Value::Int`], `FLOAT4`/`FLOAT8` as [`Value::Real`], `TEXT`/`VARCHAR`/`BPCHAR`/`NAME` as
/// [`Value::Text`], `BYTEA` as [`Value::Blob`], `NULL` of any of them as [`Value::Null`].
struct Cell(Value);

impl<'a> FromSql<'a> for Cell {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Cell, BoxError> {
        Ok(Cell(match *ty {
            Type::INT2 => Value::Int(i16::from_sql(ty, raw)?.into()),
            Type::INT4 => Value::Int(i32::from_sql(ty, raw)?.into()),
            Type::INT8 => Value::Int(i64::from_sql(ty, raw)?),
            Type::BOOL => Value::Int(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::BYTEA => Value::Blob(raw.to_vec()),
            _ => Value::Text(<&str>::from_sql(ty, raw)?.to_owned()),
        }))
    }

    fn from_sql_null(_ty: &Type) -> Result<Cell, BoxError> {
        Ok(Cell(Value::Null))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::BOOL
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::BYTEA
                | Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
                | Type::UNKNOWN
        )
    }
}

/// Binds a [`Param`] to the type PostgreSQL inferred for its placeholder: [`Param::Int`] to
/// `INT8`, `INT4` and `INT2` (range-checked: a value that does not fit is an error, never truncated),
/// `BOOL` (0 or 1 only) and `FLOAT8`; [`Param::Real`] to `FLOAT8` (and `FLOAT4`); [`Param::Text`]
/// to `TEXT`, `VARCHAR`, `BPCHAR`, `NAME` and `unknown`; [`Param::Blob`] to `BYTEA`;
/// [`Param::Null`] to any type. Any other pairing is an error naming both, reported when the
/// statement runs (as [`StoreError::Database`](crate::StoreError::Database)).
impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        match *self {
            Param::Null => Ok(IsNull::Yes),
            Param::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(i)
                    .map_err(|_| out_of_range(i, ty))?
                    .to_sql(ty, out),
                Type::INT2 => i16::try_from(i)
                    .map_err(|_| out_of_range(i, ty))?
                    .to_sql(ty, out),
                Type::BOOL => match i {
                    0 => false.to_sql(ty, out),
                    1 => true.to_sql(ty, out),
                    _ => Err(out_of_range(i, ty)),
                },
                Type::FLOAT8 => (i as f64).to_sql(ty, out),
                _ => Err(mismatch("an integer", ty)),
            },
            Param::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (f as f32).to_sql(ty, out),
                _ => Err(mismatch("a float", ty)),
            },
            Param::Text(s) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    out.extend_from_slice(s.as_bytes());
                    Ok(IsNull::No)
                }
                _ => Err(mismatch("text", ty)),
            },
            Param::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                _ => Err(mismatch("bytes", ty)),
            },
        }
    }

    /// Every type: whether the value fits is decided per value in `to_sql` (`NULL` fits any type).
    fn accepts(_ty: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

fn out_of_range(i: i64, ty: &Type) -> BoxError {
    format!("integer {i} does not fit a parameter of type {ty}").into()
}

fn mismatch(what: &str, ty: &Type) -> BoxError {
    format!("cannot bind {what} to a parameter of type {ty}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(p: Param<'_>, ty: &Type) -> Result<Vec<u8>, String> {
        let mut out = BytesMut::new();
        match p.to_sql_checked(ty, &mut out) {
            Ok(IsNull::No) => Ok(out.to_vec()),
            Ok(IsNull::Yes) => Ok(b"NULL".to_vec()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn integers_bind_to_every_integer_width_range_checked() {
        assert_eq!(
            bind(Param::Int(-2), &Type::INT8).unwrap(),
            (-2i64).to_be_bytes()
        );
        assert_eq!(
            bind(Param::Int(70_000), &Type::INT4).unwrap(),
            70_000i32.to_be_bytes()
        );
        assert_eq!(
            bind(Param::Int(-300), &Type::INT2).unwrap(),
            (-300i16).to_be_bytes()
        );
        assert_eq!(bind(Param::Int(1), &Type::BOOL).unwrap(), [1]);
        assert_eq!(bind(Param::Int(0), &Type::BOOL).unwrap(), [0]);
        assert_eq!(
            bind(Param::Int(3), &Type::FLOAT8).unwrap(),
            3f64.to_be_bytes()
        );
        assert_eq!(
            bind(Param::Int(1 << 31), &Type::INT4).unwrap_err(),
            "integer 2147483648 does not fit a parameter of type int4"
        );
        assert_eq!(
            bind(Param::Int(-40_000), &Type::INT2).unwrap_err(),
            "integer -40000 does not fit a parameter of type int2"
        );
        assert!(bind(Param::Int(2), &Type::BOOL).is_err());
    }

    #[test]
    fn text_bytes_floats_and_null_bind_to_their_types_only() {
        assert_eq!(bind(Param::Text("é"), &Type::TEXT).unwrap(), "é".as_bytes());
        assert_eq!(bind(Param::Text("v"), &Type::VARCHAR).unwrap(), b"v");
        assert_eq!(bind(Param::Text("n"), &Type::NAME).unwrap(), b"n");
        assert_eq!(bind(Param::Text("u"), &Type::UNKNOWN).unwrap(), b"u");
        assert_eq!(bind(Param::Blob(&[0, 9]), &Type::BYTEA).unwrap(), [0, 9]);
        assert_eq!(
            bind(Param::Real(0.5), &Type::FLOAT8).unwrap(),
            0.5f64.to_be_bytes()
        );
        for ty in [Type::INT8, Type::TEXT, Type::BYTEA, Type::BOOL, Type::JSONB] {
            assert_eq!(bind(Param::Null, &ty).unwrap(), b"NULL", "{ty}");
        }
        assert_eq!(
            bind(Param::Text("1"), &Type::INT8).unwrap_err(),
            "cannot bind text to a parameter of type int8"
        );
        assert_eq!(
            bind(Param::Blob(b"x"), &Type::TEXT).unwrap_err(),
            "cannot bind bytes to a parameter of type text"
        );
        assert_eq!(
            bind(Param::Real(1.0), &Type::INT8).unwrap_err(),
            "cannot bind a float to a parameter of type int8"
        );
    }

    #[test]
    fn cells_read_each_supported_type() {
        let read = |ty: &Type, raw: &[u8]| Cell::from_sql(ty, raw).unwrap().0;
        assert_eq!(read(&Type::INT2, &7i16.to_be_bytes()), Value::Int(7));
        assert_eq!(read(&Type::INT4, &(-7i32).to_be_bytes()), Value::Int(-7));
        assert_eq!(
            read(&Type::INT8, &i64::MAX.to_be_bytes()),
            Value::Int(i64::MAX)
        );
        assert_eq!(read(&Type::BOOL, &[1]), Value::Int(1));
        assert_eq!(read(&Type::FLOAT4, &0.5f32.to_be_bytes()), Value::Real(0.5));
        assert_eq!(read(&Type::FLOAT8, &2.5f64.to_be_bytes()), Value::Real(2.5));
        assert_eq!(read(&Type::TEXT, b"t"), Value::Text("t".into()));
        assert_eq!(read(&Type::BYTEA, &[1, 2]), Value::Blob(vec![1, 2]));
        assert_eq!(Cell::from_sql_null(&Type::INT8).unwrap().0, Value::Null);
        assert!(!Cell::accepts(&Type::NUMERIC));
        assert!(!Cell::accepts(&Type::JSONB));
    }
}
