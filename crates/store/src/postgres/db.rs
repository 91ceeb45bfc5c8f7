//! [`Db`] over a PostgreSQL transaction: `?N` placeholders become `$N`, each statement is prepared once
//! per connection and cached by its SQL text, parameters bind to whatever type PostgreSQL inferred for
//! them, and each column converts by its type to a [`Value`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error as StdError;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, ToSql, Type};
use postgres::{Statement, Transaction};

use crate::sql::{numbered_to_dollar, Db, Dialect, Param, Row, Value};
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

/// A [`Db`] over one open PostgreSQL transaction (`BEGIN` was sent; the owner commits or rolls back
/// with [`PgDb::into_transaction`]). Statements come from, and go into, the connection's
/// [`StatementCache`].
pub struct PgDb<'c> {
    tx: RefCell<Transaction<'c>>,
    cache: &'c RefCell<StatementCache>,
}

impl<'c> PgDb<'c> {
    /// Wraps an open transaction and the cache of the connection it runs on.
    pub fn new(tx: Transaction<'c>, cache: &'c RefCell<StatementCache>) -> PgDb<'c> {
        PgDb {
            tx: RefCell::new(tx),
            cache,
        }
    }

    /// The transaction back, to commit or roll back.
    pub fn into_transaction(self) -> Transaction<'c> {
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
            .prepare(&numbered_to_dollar(sql))
            .map_err(|e| classify(&e))?;
        let mut cache = self.cache.borrow_mut();
        if cache.map.len() >= STATEMENT_CACHE_CAPACITY {
            cache.map.clear();
        }
        cache.map.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    /// Drops `sql`'s statement after a failure that may have made it stale (the schema changed under
    /// it: SQLSTATE `0A000` "cached plan must not change result type"), so the retry prepares it anew.
    fn forget_on(&self, sql: &str, e: &postgres::Error) {
        if e.code() == Some(&postgres::error::SqlState::FEATURE_NOT_SUPPORTED) {
            self.cache.borrow_mut().map.remove(sql);
        }
    }
}

fn bind<'p>(params: &'p [Param<'_>]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

impl Db for PgDb<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn exec(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        let st = self.statement(sql)?;
        self.tx
            .borrow_mut()
            .execute(&st, &bind(params))
            .map_err(|e| {
                self.forget_on(sql, &e);
                classify(&e)
            })
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<Vec<Row>> {
        let st = self.statement(sql)?;
        let rows = self
            .tx
            .borrow_mut()
            .query(&st, &bind(params))
            .map_err(|e| {
                self.forget_on(sql, &e);
                classify(&e)
            })?;
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
