//! The one interface the shared data-access code talks to: a connection inside a transaction.
//!
//! Every query of the store is written once, in `crate::sql`, against [`Db`]; a backend (`crate::sqlite`,
//! `crate::postgres`) implements [`Db`] over its driver, opens and commits the transaction, and decides
//! nothing. SQL is written with numbered placeholders `?1 ... ?N` (SQLite's syntax; the PostgreSQL backend
//! rewrites them to `$1 ... $N` once per statement and caches the prepared statement). Where the two
//! dialects differ the code asks [`Db::dialect`]; those places are few and each says why.

use crate::StoreResult;

/// Which SQL dialect a [`Db`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.45+ (bundled): one writer; `FOR UPDATE` is neither needed nor accepted.
    Sqlite,
    /// PostgreSQL 12+: many writers; rows read to decide a write are locked with `FOR UPDATE`.
    Postgres,
}

impl Dialect {
    /// The row-lock clause to append to a `SELECT` whose rows a rule reads before writing them:
    /// `" FOR UPDATE"` on PostgreSQL (READ COMMITTED would otherwise let two transactions decide from
    /// the same snapshot), `""` on SQLite (its one writer already serializes every write transaction).
    pub fn for_update(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }
}

/// A value bound to a placeholder. Borrowed: binding copies nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param<'a> {
    /// SQL `NULL`.
    Null,
    /// A 64-bit integer (PostgreSQL `BIGINT`; also bound to `INTEGER`/`SMALLINT` and `BOOLEAN`).
    Int(i64),
    /// A float (PostgreSQL `DOUBLE PRECISION`).
    Real(f64),
    /// UTF-8 text.
    Text(&'a str),
    /// Bytes (PostgreSQL `BYTEA`, SQLite `BLOB`).
    Blob(&'a [u8]),
    /// A PostgreSQL `TEXT[]` (`None` is a `NULL` element). PostgreSQL only: SQLite has no arrays and
    /// refuses it when the statement runs. Built by `Rows` and `IdList`.
    Texts(&'a [Option<&'a str>]),
    /// A PostgreSQL `BIGINT[]` (`None` is a `NULL` element). PostgreSQL only, as [`Param::Texts`].
    Ints(&'a [Option<i64>]),
    /// A PostgreSQL `BYTEA[]` (`None` is a `NULL` element). PostgreSQL only, as [`Param::Texts`].
    Blobs(&'a [Option<&'a [u8]>]),
}

/// Turns a Rust value into a [`Param`]; what the [`p!`](crate::p) macro calls on each argument.
pub trait ToParam {
    /// The parameter, borrowing from `self`.
    fn to_param(&self) -> Param<'_>;
}

macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl ToParam for $t {
            fn to_param(&self) -> Param<'_> {
                Param::Int(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_param!(i64, i32, u32, u16, u8, u64, usize);

impl ToParam for bool {
    fn to_param(&self) -> Param<'_> {
        Param::Int(*self as i64)
    }
}
impl ToParam for f64 {
    fn to_param(&self) -> Param<'_> {
        Param::Real(*self)
    }
}
impl ToParam for str {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}
impl ToParam for String {
    fn to_param(&self) -> Param<'_> {
        Param::Text(self)
    }
}
impl ToParam for [u8] {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}
impl ToParam for Vec<u8> {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}
impl ToParam for bytes::Bytes {
    fn to_param(&self) -> Param<'_> {
        Param::Blob(self)
    }
}
impl<T: ToParam + ?Sized> ToParam for &T {
    fn to_param(&self) -> Param<'_> {
        (**self).to_param()
    }
}
impl<T: ToParam> ToParam for Option<T> {
    fn to_param(&self) -> Param<'_> {
        match self {
            Some(v) => v.to_param(),
            None => Param::Null,
        }
    }
}
impl ToParam for Param<'_> {
    fn to_param(&self) -> Param<'_> {
        *self
    }
}

/// Builds the parameter slice of a statement: `p![a, b, c]` is `&[a.to_param(), ...]`. Each argument
/// is borrowed, so temporaries (`x.to_string()`) live until the end of the enclosing statement.
#[macro_export]
macro_rules! p {
    () => { &[] as &[$crate::sql::Param<'_>] };
    ($($x:expr),+ $(,)?) => {
        &[$($crate::sql::ToParam::to_param(&$x)),+] as &[$crate::sql::Param<'_>]
    };
}

/// A column value read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// Any integer or boolean column.
    Int(i64),
    /// A float column.
    Real(f64),
    /// A text column.
    Text(String),
    /// A blob / bytea column.
    Blob(Vec<u8>),
}

/// One result row: its values by position (0-based, in the `SELECT` list's order).
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Value>);

impl Row {
    /// Column `i` as `T`. Errors: no such column, or a value of another type (a schema bug, reported as
    /// [`StoreError::Database`](crate::StoreError::Database) naming the column and both types).
    pub fn get<T: FromValue>(&self, i: usize) -> StoreResult<T> {
        let v = self.0.get(i).ok_or_else(|| no_column(i))?;
        T::from_value(v).ok_or_else(|| wrong_type::<T>(i, v))
    }

    /// Column `i` moved out as `T` (no copy of text or bytes); the row keeps `NULL` in its place.
    pub fn take<T: FromValue>(&mut self, i: usize) -> StoreResult<T> {
        let slot = self.0.get_mut(i).ok_or_else(|| no_column(i))?;
        let v = std::mem::replace(slot, Value::Null);
        let what = kind(&v);
        T::from_owned(v).ok_or_else(|| {
            crate::StoreError::Database(format!(
                "column {i}: cannot read {what} as {}",
                std::any::type_name::<T>()
            ))
        })
    }
}

fn no_column(i: usize) -> crate::StoreError {
    crate::StoreError::Database(format!("column {i}: the query returned fewer columns"))
}

fn wrong_type<T>(i: usize, v: &Value) -> crate::StoreError {
    crate::StoreError::Database(format!(
        "column {i}: cannot read {} as {}",
        kind(v),
        std::any::type_name::<T>()
    ))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "NULL",
        Value::Int(_) => "an integer",
        Value::Real(_) => "a float",
        Value::Text(_) => "text",
        Value::Blob(_) => "bytes",
    }
}

/// A Rust type a column value converts to. `None` means "not this type".
pub trait FromValue: Sized {
    /// From a borrowed value (copies text and bytes).
    fn from_value(v: &Value) -> Option<Self>;
    /// From an owned value; the default copies via [`FromValue::from_value`].
    fn from_owned(v: Value) -> Option<Self> {
        Self::from_value(&v)
    }
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            fn from_value(v: &Value) -> Option<Self> {
                match v {
                    Value::Int(i) => <$t>::try_from(*i).ok(),
                    _ => None,
                }
            }
        }
    )*};
}
int_value!(i64, i32, u32, u16, u8, u64, usize);

impl FromValue for bool {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Int(i) => Some(*i != 0),
            _ => None,
        }
    }
}
impl FromValue for f64 {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Real(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }
}
impl FromValue for String {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
    fn from_owned(v: Value) -> Option<Self> {
        match v {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }
}
impl FromValue for Vec<u8> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Blob(b) => Some(b.clone()),
            Value::Text(s) => Some(s.as_bytes().to_vec()),
            _ => None,
        }
    }
    fn from_owned(v: Value) -> Option<Self> {
        match v {
            Value::Blob(b) => Some(b),
            Value::Text(s) => Some(s.into_bytes()),
            _ => None,
        }
    }
}
impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            other => T::from_value(other).map(Some),
        }
    }
    fn from_owned(v: Value) -> Option<Self> {
        match v {
            Value::Null => Some(None),
            other => T::from_owned(other).map(Some),
        }
    }
}
impl FromValue for Value {
    fn from_value(v: &Value) -> Option<Self> {
        Some(v.clone())
    }
}

/// A connection inside an open transaction. Implemented by each backend; used only by the shared
/// data-access code in `crate::sql`. Methods take `&self` (a backend keeps its transaction behind
/// interior mutability) so helpers can pass one `&dyn Db` around freely.
///
/// Errors are typed by the backend: a lock or serialization conflict is
/// [`StoreError::Retryable`](crate::StoreError::Retryable) (the caller's transaction is retried whole),
/// a full disk [`StoreError::Unavailable`](crate::StoreError::Unavailable), anything else
/// [`StoreError::Database`](crate::StoreError::Database).
pub trait Db {
    /// The SQL dialect of this connection.
    fn dialect(&self) -> Dialect;
    /// Runs one statement; returns the number of rows it inserted, updated or deleted.
    fn exec(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<u64>;
    /// Runs one query; returns every row (callers bound the result with `LIMIT`).
    fn query(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<Vec<Row>>;

    /// Runs `statements` (`(sql, params)` each, as [`Db::exec`] takes them) in order inside the same
    /// transaction; returns each one's row count, in the same order. For writes whose inputs do not
    /// depend on each other's results: every statement is sent whatever the earlier ones answer. A
    /// caller that decides from a count reads it afterwards and, when the decision is "stop", returns
    /// an error so the transaction (or the item's savepoint) rolls back what was sent after it (the
    /// attempt's fence, `sql/pipeline.rs`); when what follows depends on the count's value, not just
    /// on whether to go on, it runs that statement alone with [`Db::exec`] (the run row's insert).
    ///
    /// PostgreSQL sends them all, then reads all the answers: one network round trip instead of one
    /// per statement (what makes it worth using on any hot path: the attempt's commit, the ingest
    /// commit, a run event and its outbox rows). The default runs them one by one (SQLite: no
    /// network, nothing to save).
    ///
    /// Errors: the first failing statement's error, typed as [`Db::exec`]'s; the statements after it
    /// may have been sent and failed too (PostgreSQL: `25P02`, transaction aborted), so the caller
    /// returns the error and its whole transaction is rolled back, as for any failed statement.
    fn exec_many(&self, statements: &[(&str, &[Param<'_>])]) -> StoreResult<Vec<u64>> {
        statements
            .iter()
            .map(|(sql, params)| self.exec(sql, params))
            .collect()
    }

    /// Runs the queries `statements` in order inside the same transaction; returns each one's rows, in
    /// the same order. As [`Db::exec_many`]: for reads none of which depends on another's answer (the
    /// attempt's locked load and the live outbound webhooks it may fan out to), sent together on
    /// PostgreSQL (one round trip), one by one by default. Errors: the first failing query's.
    fn query_many(&self, statements: &[(&str, &[Param<'_>])]) -> StoreResult<Vec<Vec<Row>>> {
        statements
            .iter()
            .map(|(sql, params)| self.query(sql, params))
            .collect()
    }
}

impl dyn Db + '_ {
    /// The first row mapped by `f`, or `None` when the query returned no row.
    pub fn row<T>(
        &self,
        sql: &str,
        params: &[Param<'_>],
        f: impl FnOnce(&Row) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        match self.query(sql, params)?.first() {
            Some(r) => f(r).map(Some),
            None => Ok(None),
        }
    }

    /// Every row mapped by `f`, in the query's order.
    pub fn rows<T>(
        &self,
        sql: &str,
        params: &[Param<'_>],
        f: impl FnMut(&Row) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        self.query(sql, params)?.iter().map(f).collect()
    }

    /// The first column of the first row as `T`, or `None` when there is no row.
    pub fn value<T: FromValue>(&self, sql: &str, params: &[Param<'_>]) -> StoreResult<Option<T>> {
        match self.query(sql, params)?.into_iter().next() {
            Some(mut r) => r.take(0).map(Some),
            None => Ok(None),
        }
    }
}

/// The PostgreSQL text of a statement written for both dialects: `?N` placeholders become `$N`, and the
/// SQLite planner hint `INDEXED BY <index>` is dropped (PostgreSQL picks indexes by statistics and has no
/// such clause). Quoted text and identifiers are left untouched.
pub fn to_postgres(sql: &str) -> String {
    let dollar = numbered_to_dollar(sql);
    let mut out = String::with_capacity(dollar.len());
    let mut rest = dollar.as_str();
    while let Some(i) = rest.find(" INDEXED BY ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + " INDEXED BY ".len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Rewrites `?N` placeholders to `$N` for PostgreSQL, leaving quoted text and identifiers untouched.
pub fn numbered_to_dollar(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(ch) = chars.next() {
        match quote {
            Some(q) => {
                out.push(ch);
                if ch == q {
                    quote = None;
                }
            }
            None => match ch {
                '\'' | '"' => {
                    quote = Some(ch);
                    out.push(ch);
                }
                '?' if chars.peek().is_some_and(|c| c.is_ascii_digit()) => out.push('$'),
                _ => out.push(ch),
            },
        }
    }
    out
}

/// The type of one column of a multi-row statement's rows ([`Rows`]): its PostgreSQL array type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Col {
    /// `TEXT` (bound as `TEXT[]`): [`Param::Text`] or [`Param::Null`].
    Text,
    /// `BIGINT` (bound as `BIGINT[]`): [`Param::Int`] or [`Param::Null`].
    Int,
    /// `BYTEA` (bound as `BYTEA[]`): [`Param::Blob`] or [`Param::Null`].
    Blob,
}

impl Col {
    fn pg_array(self) -> &'static str {
        match self {
            Col::Text => "text[]",
            Col::Int => "bigint[]",
            Col::Blob => "bytea[]",
        }
    }
}

/// One column's values, bound as one PostgreSQL array.
#[derive(Debug)]
enum Array<'a> {
    Text(Vec<Option<&'a str>>),
    Int(Vec<Option<i64>>),
    Blob(Vec<Option<&'a [u8]>>),
}

/// The rows of a multi-row statement, sent the way each dialect takes them; the one place where a
/// batched statement's text depends on the dialect. The statement is written once around
/// [`Rows::table`] (or [`Rows::values`]) and reads the rows' columns as `v.column1 ... v.columnN`.
///
/// - SQLite: a `VALUES` list, one `(?1, ?2, ...)` per row (SQLite has no arrays; its statement cache
///   is per connection and cheap), so the text varies with the row count.
/// - PostgreSQL: one array parameter per column, expanded with `unnest` (which zips the arrays row by
///   row, in order), so the text is the same for any row count: one prepared statement per
///   statement kind, however the batches are sized (the server keeps a parse tree and plans per
///   prepared statement and connection; a text per batch size made up to one per kind and size,
///   hundreds per connection).
///
/// The placeholders are `?1 ... ?k` for `k` columns (SQLite: `?1 ... ?(k * rows)`); the statement
/// binds [`Rows::params`] and nothing else.
#[derive(Debug)]
pub(crate) struct Rows<'a> {
    dialect: Dialect,
    cols: &'static [Col],
    len: usize,
    /// SQLite: every row's parameters, row after row.
    flat: Vec<Param<'a>>,
    /// PostgreSQL: one array per column.
    arrays: Vec<Array<'a>>,
    /// A value that does not fit its column's type (a bug of the caller), reported by
    /// [`Rows::params`].
    wrong: Option<String>,
}

impl<'a> Rows<'a> {
    /// No rows yet, of columns `cols` (in the statement's order).
    pub(crate) fn new(dialect: Dialect, cols: &'static [Col]) -> Rows<'a> {
        let arrays = match dialect {
            Dialect::Sqlite => Vec::new(),
            Dialect::Postgres => cols
                .iter()
                .map(|c| match c {
                    Col::Text => Array::Text(Vec::new()),
                    Col::Int => Array::Int(Vec::new()),
                    Col::Blob => Array::Blob(Vec::new()),
                })
                .collect(),
        };
        Rows {
            dialect,
            cols,
            len: 0,
            flat: Vec::new(),
            arrays,
            wrong: None,
        }
    }

    /// Adds one row: one value per column, in the columns' order. A row of another length, or a value
    /// of another type than its column's, makes [`Rows::params`] an error.
    pub(crate) fn push(&mut self, row: &[Param<'a>]) {
        if row.len() != self.cols.len() {
            self.wrong = Some(format!(
                "a row of {} values for {} columns",
                row.len(),
                self.cols.len()
            ));
            return;
        }
        self.len += 1;
        if self.dialect == Dialect::Sqlite {
            self.flat.extend_from_slice(row);
            return;
        }
        for (k, (p, a)) in row.iter().zip(self.arrays.iter_mut()).enumerate() {
            match (a, *p) {
                (Array::Text(v), Param::Text(s)) => v.push(Some(s)),
                (Array::Text(v), Param::Null) => v.push(None),
                (Array::Int(v), Param::Int(i)) => v.push(Some(i)),
                (Array::Int(v), Param::Null) => v.push(None),
                (Array::Blob(v), Param::Blob(b)) => v.push(Some(b)),
                (Array::Blob(v), Param::Null) => v.push(None),
                (_, other) => {
                    self.wrong = Some(format!(
                        "column {} ({:?}) cannot take {other:?}",
                        k + 1,
                        self.cols[k]
                    ));
                    return;
                }
            }
        }
    }

    /// Whether no row was pushed.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The rows as a table for a `FROM` clause, named `v` with columns `column1 ... columnN`: SQLite
    /// `(VALUES (?1, ?2), (?3, ?4)) AS v`, PostgreSQL
    /// `unnest(?1::text[], ?2::bigint[]) AS v(column1, column2)`.
    pub(crate) fn table(&self) -> String {
        match self.dialect {
            Dialect::Sqlite => format!("(VALUES {}) AS v", self.sqlite_rows()),
            Dialect::Postgres => {
                let names: Vec<String> = (1..=self.cols.len())
                    .map(|k| format!("column{k}"))
                    .collect();
                format!("{} AS v({})", self.unnest(), names.join(", "))
            }
        }
    }

    /// The rows as the source of an `INSERT INTO t (cols) ...` naming every column in order: SQLite
    /// `VALUES (?1, ?2), (?3, ?4)`, PostgreSQL `SELECT * FROM unnest(?1::text[], ?2::bigint[])`.
    pub(crate) fn values(&self) -> String {
        match self.dialect {
            Dialect::Sqlite => format!("VALUES {}", self.sqlite_rows()),
            Dialect::Postgres => format!("SELECT * FROM {}", self.unnest()),
        }
    }

    /// The rows' parameters, in their placeholders' order. Errors: `Database` for a row that did not
    /// fit the columns (see [`Rows::push`]).
    pub(crate) fn params(&self) -> crate::StoreResult<Vec<Param<'_>>> {
        if let Some(w) = &self.wrong {
            return Err(crate::StoreError::Database(format!(
                "multi-row statement: {w}"
            )));
        }
        Ok(match self.dialect {
            Dialect::Sqlite => self.flat.clone(),
            Dialect::Postgres => self
                .arrays
                .iter()
                .map(|a| match a {
                    Array::Text(v) => Param::Texts(v),
                    Array::Int(v) => Param::Ints(v),
                    Array::Blob(v) => Param::Blobs(v),
                })
                .collect(),
        })
    }

    fn sqlite_rows(&self) -> String {
        values_rows(self.len, &vec![""; self.cols.len()])
    }

    fn unnest(&self) -> String {
        let args: Vec<String> = self
            .cols
            .iter()
            .enumerate()
            .map(|(k, c)| format!("?{}::{}", k + 1, c.pg_array()))
            .collect();
        format!("unnest({})", args.join(", "))
    }
}

/// A list of text keys a statement matches a column against, sent the way each dialect takes it: the
/// one place where such a condition depends on the dialect. SQLite `col IN (?1, ..., ?n)`, PostgreSQL
/// `col = ANY(?1::text[])` (one array parameter: the same text for any number of keys).
#[derive(Debug)]
pub(crate) struct IdList<'a> {
    dialect: Dialect,
    ids: Vec<Option<&'a str>>,
}

impl<'a> IdList<'a> {
    /// The keys `ids`, in order.
    pub(crate) fn new(dialect: Dialect, ids: &[&'a str]) -> IdList<'a> {
        IdList {
            dialect,
            ids: ids.iter().map(|id| Some(*id)).collect(),
        }
    }

    /// The condition that `column` is one of the keys; its placeholders start at `?1`.
    pub(crate) fn condition(&self, column: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => {
                let ps: Vec<String> = (1..=self.ids.len()).map(|i| format!("?{i}")).collect();
                format!("{column} IN ({})", ps.join(", "))
            }
            Dialect::Postgres => format!("{column} = ANY(?1::text[])"),
        }
    }

    /// The keys' parameters, in their placeholders' order.
    pub(crate) fn params(&self) -> Vec<Param<'_>> {
        match self.dialect {
            Dialect::Sqlite => self
                .ids
                .iter()
                .map(|id| id.map_or(Param::Null, Param::Text))
                .collect(),
            Dialect::Postgres => vec![Param::Texts(&self.ids)],
        }
    }
}

/// `(?a, CAST(?b AS BIGINT), ...)` rows for a multi-row statement: `rows` rows of `casts.len()`
/// columns, numbered from 1; a column whose cast is `""` is bound as it is (text).
pub(crate) fn values_rows(rows: usize, casts: &[&str]) -> String {
    let mut out = String::with_capacity(rows * casts.len() * 8);
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for (k, cast) in casts.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            let n = r * casts.len() + k + 1;
            if cast.is_empty() {
                out.push_str(&format!("?{n}"));
            } else {
                out.push_str(&format!("CAST(?{n} AS {cast})"));
            }
        }
        out.push(')');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_outside_quotes_only() {
        assert_eq!(
            numbered_to_dollar("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND \"?3\" = ?12"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND \"?3\" = $12"
        );
        assert_eq!(numbered_to_dollar("json ? 'k'"), "json ? 'k'");
        assert_eq!(
            to_postgres("SELECT id FROM deliveries INDEXED BY deliveries_due WHERE due_at <= ?1"),
            "SELECT id FROM deliveries WHERE due_at <= $1"
        );
    }

    #[test]
    fn params_borrow_and_convert() {
        let s = String::from("x");
        let none: Option<i64> = None;
        let bytes = vec![1u8, 2];
        let ps = crate::p![s, 5u32, none, true, "lit", bytes];
        assert_eq!(
            ps,
            &[
                Param::Text("x"),
                Param::Int(5),
                Param::Null,
                Param::Int(1),
                Param::Text("lit"),
                Param::Blob(&[1, 2])
            ]
        );
    }

    #[test]
    fn rows_convert_and_report_type_errors() {
        let mut r = Row(vec![
            Value::Int(3),
            Value::Text("t".into()),
            Value::Null,
            Value::Blob(vec![9]),
        ]);
        assert_eq!(r.get::<i64>(0).unwrap(), 3);
        assert!(r.get::<bool>(0).unwrap());
        assert_eq!(r.get::<Option<String>>(2).unwrap(), None);
        assert_eq!(r.take::<String>(1).unwrap(), "t");
        assert_eq!(r.take::<Vec<u8>>(3).unwrap(), vec![9]);
        let e = r.get::<String>(0).unwrap_err().to_string();
        assert!(e.contains("column 0: cannot read an integer as"), "{e}");
        assert!(r.get::<i64>(7).is_err(), "a missing column is not a value");
    }

    #[test]
    fn values_rows_numbers_placeholders_row_by_row_and_casts_where_asked() {
        assert_eq!(
            values_rows(2, &["", "BIGINT"]),
            "(?1, CAST(?2 AS BIGINT)), (?3, CAST(?4 AS BIGINT))"
        );
        assert_eq!(values_rows(1, &[""]), "(?1)");
    }

    #[test]
    fn rows_are_a_values_list_on_sqlite_and_one_array_per_column_on_postgres() {
        const COLS: &[Col] = &[Col::Text, Col::Int, Col::Blob];
        let push = |rows: &mut Rows<'_>| {
            rows.push(&[Param::Text("a"), Param::Int(1), Param::Null]);
            rows.push(&[Param::Null, Param::Int(2), Param::Blob(&[7])]);
        };
        let mut lite = Rows::new(Dialect::Sqlite, COLS);
        push(&mut lite);
        assert_eq!(lite.values(), "VALUES (?1, ?2, ?3), (?4, ?5, ?6)");
        assert_eq!(lite.table(), "(VALUES (?1, ?2, ?3), (?4, ?5, ?6)) AS v");
        assert_eq!(lite.params().unwrap().len(), 6);
        let mut pg = Rows::new(Dialect::Postgres, COLS);
        push(&mut pg);
        assert_eq!(
            pg.values(),
            "SELECT * FROM unnest(?1::text[], ?2::bigint[], ?3::bytea[])"
        );
        assert_eq!(
            pg.table(),
            "unnest(?1::text[], ?2::bigint[], ?3::bytea[]) AS v(column1, column2, column3)"
        );
        assert_eq!(
            pg.params().unwrap(),
            vec![
                Param::Texts(&[Some("a"), None]),
                Param::Ints(&[Some(1), Some(2)]),
                Param::Blobs(&[None, Some(&[7u8][..])]),
            ]
        );
        // The text does not depend on the row count.
        let mut one = Rows::new(Dialect::Postgres, COLS);
        one.push(&[Param::Text("b"), Param::Null, Param::Null]);
        assert_eq!(one.values(), pg.values());
        // A value of another type than its column's is refused, not bound as something else.
        let mut bad = Rows::new(Dialect::Postgres, COLS);
        bad.push(&[Param::Int(1), Param::Int(1), Param::Null]);
        let e = bad.params().unwrap_err().to_string();
        assert!(e.contains("column 1 (Text) cannot take Int(1)"), "{e}");
        let mut short = Rows::new(Dialect::Sqlite, COLS);
        short.push(&[Param::Null]);
        assert!(short.params().is_err());
    }

    #[test]
    fn id_lists_are_in_lists_on_sqlite_and_one_array_on_postgres() {
        let ids = ["d1", "d2", "d3"];
        let lite = IdList::new(Dialect::Sqlite, &ids);
        assert_eq!(lite.condition("d.id"), "d.id IN (?1, ?2, ?3)");
        assert_eq!(
            lite.params(),
            vec![Param::Text("d1"), Param::Text("d2"), Param::Text("d3")]
        );
        let pg = IdList::new(Dialect::Postgres, &ids);
        assert_eq!(pg.condition("d.id"), "d.id = ANY(?1::text[])");
        assert_eq!(
            pg.params(),
            vec![Param::Texts(&[Some("d1"), Some("d2"), Some("d3")])]
        );
    }
}
