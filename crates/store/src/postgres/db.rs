//! [`Db`] over a PostgreSQL connection driven with `tokio-postgres`: `?N` placeholders become `$N`,
//! each statement is prepared once per connection and cached by its SQL text, parameters bind to
//! whatever type PostgreSQL inferred for them, and each column converts by its type to a [`Value`].
//!
//! Round trips: the connection thread drives its client with `block_on` on its own current-thread
//! runtime, so whatever is sent before waiting goes out together and is answered together (the
//! extended protocol allows any number of `Bind`/`Execute`/`Sync` in flight). A transaction's `BEGIN`
//! is not sent on its own: it goes out with the transaction's first statement (see
//! [`PgDb::transaction`]), and [`Db::exec_many`] sends all of its statements before reading any answer.

use std::cell::{Cell as Slot, RefCell};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use bytes::BytesMut;
use tokio::runtime::Runtime;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, Statement};

use crate::sql::{to_postgres, Db, Dialect, Param, Row, Value};
use crate::{StoreError, StoreResult};

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

/// A [`Db`] over one connection: either one transaction whose `BEGIN` is sent with its first
/// statement ([`PgDb::transaction`]; the owner then commits or rolls back if [`PgDb::begun`]), or the
/// client in autocommit for a point read ([`PgDb::autocommit`]), where each statement is its own
/// snapshot. Statements come from, and go into, the connection's [`StatementCache`]; every call blocks
/// on the connection's runtime `rt` (never call it on a Tokio runtime thread).
pub struct PgDb<'c> {
    client: &'c Client,
    rt: &'c Runtime,
    cache: &'c RefCell<StatementCache>,
    /// The pool's count of round trips (`PgPool::round_trips`): one per awaited message.
    trips: &'c AtomicU64,
    /// The `BEGIN ...` still to send (with the next statement); `None` once sent, or in autocommit.
    begin: Slot<Option<&'static str>>,
    /// Whether a `BEGIN` was sent.
    begun: Slot<bool>,
    /// Why the `BEGIN` failed, or why the connection was found gone (preparing a statement) before the
    /// `BEGIN` was sent: every later statement is refused with it, unsent.
    begin_failed: RefCell<Option<tokio_postgres::Error>>,
}

impl<'c> PgDb<'c> {
    /// A transaction on `client`: `begin` (e.g. `BEGIN ISOLATION LEVEL READ COMMITTED`) is sent in
    /// the same round trip as the first statement, just before it, so the transaction costs no round
    /// trip of its own at its start. Nothing is sent until a statement runs.
    pub fn transaction(
        client: &'c Client,
        rt: &'c Runtime,
        cache: &'c RefCell<StatementCache>,
        trips: &'c AtomicU64,
        begin: &'static str,
    ) -> PgDb<'c> {
        PgDb {
            client,
            rt,
            cache,
            trips,
            begin: Slot::new(Some(begin)),
            begun: Slot::new(false),
            begin_failed: RefCell::new(None),
        }
    }

    /// The client in autocommit: no `BEGIN`/`COMMIT`, each statement commits (or reads) on its own.
    pub fn autocommit(
        client: &'c Client,
        rt: &'c Runtime,
        cache: &'c RefCell<StatementCache>,
        trips: &'c AtomicU64,
    ) -> PgDb<'c> {
        PgDb {
            client,
            rt,
            cache,
            trips,
            begin: Slot::new(None),
            begun: Slot::new(false),
            begin_failed: RefCell::new(None),
        }
    }

    /// Whether the transaction's `BEGIN` was sent (so the owner must `COMMIT` or `ROLLBACK`); `false`
    /// in autocommit and for a transaction that ran no statement.
    pub fn begun(&self) -> bool {
        self.begun.get()
    }

    /// Why the `BEGIN` failed, or the connection was found gone before it was sent (taken: a second
    /// call answers `None`). The job's statements all failed with it and nothing of the job reached
    /// the server inside a transaction; the owner decides from it whether the connection is gone.
    pub fn take_begin_error(&self) -> Option<tokio_postgres::Error> {
        self.begin_failed.borrow_mut().take()
    }

    /// The prepared statement for `sql` (written with `?N`), preparing and caching it on first use
    /// (one round trip, outside the transaction's pipeline: a prepared statement is not transactional).
    /// Errors: the server refused to prepare it (typed by [`classify`]).
    fn statement(&self, sql: &str) -> StoreResult<Statement> {
        self.refuse_after_failed_begin()?;
        if let Some(st) = self.cache.borrow().map.get(sql) {
            return Ok(st.clone());
        }
        self.trips.fetch_add(1, Ordering::Relaxed);
        let st = match self.rt.block_on(self.client.prepare(&to_postgres(sql))) {
            Ok(st) => st,
            Err(e) => {
                let err = classify(&e);
                if self.begin.get().is_some() && super::error::connection_lost(&e) {
                    // Nothing of the transaction was sent: as if its BEGIN had failed.
                    *self.begin_failed.borrow_mut() = Some(e);
                }
                return Err(err);
            }
        };
        let mut cache = self.cache.borrow_mut();
        if cache.map.len() >= STATEMENT_CACHE_CAPACITY {
            cache.map.clear();
        }
        cache.map.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    fn refuse_after_failed_begin(&self) -> StoreResult<()> {
        match &*self.begin_failed.borrow() {
            Some(e) => Err(classify(e)),
            None => Ok(()),
        }
    }

    /// Runs `work` to its end on the connection's runtime; when the transaction's `BEGIN` is still to
    /// be sent, it is sent first, in the same round trip. Errors: the `BEGIN` failed (typed by
    /// [`classify`]; kept for [`PgDb::take_begin_error`], and `work`'s own answer is dropped).
    fn block<T>(&self, work: impl Future<Output = T>) -> StoreResult<T> {
        self.trips.fetch_add(1, Ordering::Relaxed);
        let Some(begin) = self.begin.take() else {
            return Ok(self.rt.block_on(work));
        };
        self.begun.set(true);
        let (began, out) = self
            .rt
            .block_on(both_in_order(self.client.batch_execute(begin), work));
        match began {
            Ok(()) => Ok(out),
            Err(e) => {
                let err = classify(&e);
                *self.begin_failed.borrow_mut() = Some(e);
                Err(err)
            }
        }
    }

    /// Types the failure of `sql`'s statement. A statement the schema changed under (a column added
    /// by a newer replica's migration: SQLSTATE `0A000` "cached plan must not change result type") is
    /// dropped from the cache and the failure is [`StoreError::Retryable`], so the transaction runs
    /// again and prepares it anew; anything else is typed by [`classify`].
    fn failed(&self, sql: &str, e: &tokio_postgres::Error) -> StoreError {
        let stale = e.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
            && e.as_db_error()
                .is_some_and(|d| d.message().contains("cached plan"));
        if stale {
            self.cache.borrow_mut().map.remove(sql);
            return StoreError::Retryable(format!(
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

/// [`bind`] of each statement's parameters.
fn binds<'p>(statements: &'p [(&str, &[Param<'_>])]) -> Vec<Vec<&'p (dyn ToSql + Sync)>> {
    statements.iter().map(|(_, params)| bind(params)).collect()
}

/// Polls `a` then `b` (always in that order) until both are done. A `tokio-postgres` request is
/// queued to the connection on its future's first poll, so `a`'s request goes out before `b`'s and
/// both in one write.
async fn both_in_order<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(move |cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.is_some(), rb.is_some()) {
            (true, true) => Poll::Ready((ra.take().expect("a"), rb.take().expect("b"))),
            _ => Poll::Pending,
        }
    })
    .await
}

/// Polls every future, in order, until all are done; their outputs in the same order. As
/// [`both_in_order`]: every request is queued before any answer is awaited (one round trip).
async fn all_in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(outs.iter_mut().map(|o| o.take().expect("done")).collect())
        }
    })
    .await
}

impl Db for PgDb<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn exec(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64> {
        let st = self.statement(sql)?;
        let binds = bind(params);
        self.block(self.client.execute(&st, &binds))?
            .map_err(|e| self.failed(sql, &e))
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<Vec<Row>> {
        let st = self.statement(sql)?;
        let binds = bind(params);
        let rows = self
            .block(self.client.query(&st, &binds))?
            .map_err(|e| self.failed(sql, &e))?;
        rows.iter().map(row).collect()
    }

    /// Sends every statement (each `Bind`/`Execute`/`Sync`; with the transaction's `BEGIN` first if
    /// it is still to be sent), then reads every answer: one round trip for all of them (plus one per
    /// statement not yet prepared on this connection). The server runs them in order; once one fails
    /// the transaction is aborted and the later ones fail with `25P02`, so the error returned is the
    /// first one in order. In autocommit each statement commits on its own.
    fn exec_many(&self, statements: &[(&str, &[Param<'_>])]) -> StoreResult<Vec<u64>> {
        let (prepared, binds) = (self.prepare_all(statements)?, binds(statements));
        self.pipelined(statements, &prepared, &binds, |c, st, b| c.execute(st, b))
    }

    /// As [`Db::exec_many`] here, for queries: every query is sent before any answer is read (one
    /// round trip).
    fn query_many(&self, statements: &[(&str, &[Param<'_>])]) -> StoreResult<Vec<Vec<Row>>> {
        let (prepared, binds) = (self.prepare_all(statements)?, binds(statements));
        self.pipelined(statements, &prepared, &binds, |c, st, b| c.query(st, b))?
            .iter()
            .map(|rows| rows.iter().map(row).collect())
            .collect()
    }
}

impl PgDb<'_> {
    /// The prepared statement of each of `statements`, in order.
    fn prepare_all(&self, statements: &[(&str, &[Param<'_>])]) -> StoreResult<Vec<Statement>> {
        statements
            .iter()
            .map(|(sql, _)| self.statement(sql))
            .collect()
    }

    /// Sends each prepared statement with its parameters through `send` (one driver request each),
    /// then reads every answer: one round trip. The answers in order; the first error in order is
    /// returned, typed as [`Db::exec`]'s.
    fn pipelined<'a, T, Fut>(
        &'a self,
        statements: &[(&str, &[Param<'_>])],
        prepared: &'a [Statement],
        binds: &'a [Vec<&'a (dyn ToSql + Sync)>],
        send: impl Fn(&'a Client, &'a Statement, &'a [&'a (dyn ToSql + Sync)]) -> Fut,
    ) -> StoreResult<Vec<T>>
    where
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let sent = prepared
            .iter()
            .zip(binds)
            .map(|(st, b)| send(self.client, st, b))
            .collect::<Vec<_>>();
        self.block(all_in_order(sent))?
            .into_iter()
            .zip(statements)
            .map(|(a, (sql, _))| a.map_err(|e| self.failed(sql, &e)))
            .collect()
    }
}

/// Converts one PostgreSQL row. Errors: a column of a type [`Cell`] does not read (named with its
/// position and type; cast it in the SQL, e.g. `CAST(SUM(x) AS BIGINT)`, since `SUM(bigint)` is
/// `NUMERIC` in PostgreSQL).
fn row(r: &tokio_postgres::Row) -> StoreResult<Row> {
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
/// [`Param::Null`] to any type; [`Param::Texts`], [`Param::Ints`] and [`Param::Blobs`] to `TEXT[]`
/// (and `VARCHAR[]`), `BIGINT[]` and `BYTEA[]`. Any other pairing is an error naming both, reported when the
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
            Param::Texts(v) => array(v, "a text array", ty, out),
            Param::Ints(v) => array(v, "an integer array", ty, out),
            Param::Blobs(v) => array(v, "a bytes array", ty, out),
        }
    }

    /// Every type: whether the value fits is decided per value in `to_sql` (`NULL` fits any type).
    fn accepts(_ty: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// Binds `values` as a one-dimensional array (`None` is a `NULL` element) to a placeholder whose type
/// is an array of their type (`TEXT[]`/`VARCHAR[]`, `BIGINT[]`, `BYTEA[]`: the statement casts it,
/// e.g. `?1::text[]`); any other type is an error naming both.
fn array<T: ToSql>(
    values: &[T],
    what: &str,
    ty: &Type,
    out: &mut BytesMut,
) -> Result<IsNull, BoxError> {
    if !<&[T] as ToSql>::accepts(ty) {
        return Err(mismatch(what, ty));
    }
    values.to_sql(ty, out)
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

    #[test]
    fn arrays_bind_to_their_array_types_only() {
        let texts = [Some("a"), None];
        let ints = [Some(7i64), None];
        let blobs: [Option<&[u8]>; 1] = [Some(&[1, 2])];
        assert!(bind(Param::Texts(&texts), &Type::TEXT_ARRAY).is_ok());
        assert!(bind(Param::Ints(&ints), &Type::INT8_ARRAY).is_ok());
        assert!(bind(Param::Blobs(&blobs), &Type::BYTEA_ARRAY).is_ok());
        assert_eq!(
            bind(Param::Texts(&texts), &Type::TEXT).unwrap_err(),
            "cannot bind a text array to a parameter of type text"
        );
        assert_eq!(
            bind(Param::Ints(&ints), &Type::TEXT_ARRAY).unwrap_err(),
            "cannot bind an integer array to a parameter of type _text"
        );
    }
}
