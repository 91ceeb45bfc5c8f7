//! Writes gathered from several helpers and sent together with ONE [`Db::exec_many`]: on PostgreSQL one
//! network round trip for all of them instead of one each (docs/architecture.md §7, the PostgreSQL
//! adapter's round trips).
//!
//! A helper that would run its statement at once (`insert_attempts`, a run event and its outbox, a
//! receipt's state) queues it here instead; the caller sends the queue when every statement of the step
//! is in. Only writes whose text and parameters depend on nothing the database answers in the same
//! step go here: a caller that decides from an answer (a fenced update's row count) reads it from the
//! counts [`Pipeline::send`] returns, in push order, after everything was sent. That is safe because
//! every error of the step rolls back the whole transaction (or the item's savepoint): a write queued
//! after a check that fails is rolled back with it.
//!
//! The parameters are copied when pushed (a [`Param`] borrows; the queue outlives the helpers' locals).
//! What a hot path queues is small (ids, states, JSON of a few hundred bytes), never a receipt's body.

use super::{Db, Param};
use crate::StoreResult;

/// A [`Param`] with its own storage.
#[derive(Debug, Clone, PartialEq)]
enum Owned {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    Texts(Vec<Option<String>>),
    Ints(Vec<Option<i64>>),
    Blobs(Vec<Option<Vec<u8>>>),
}

impl Owned {
    fn of(p: &Param<'_>) -> Owned {
        match *p {
            Param::Null => Owned::Null,
            Param::Int(i) => Owned::Int(i),
            Param::Real(f) => Owned::Real(f),
            Param::Text(s) => Owned::Text(s.to_owned()),
            Param::Blob(b) => Owned::Blob(b.to_vec()),
            Param::Texts(v) => Owned::Texts(v.iter().map(|s| s.map(str::to_owned)).collect()),
            Param::Ints(v) => Owned::Ints(v.to_vec()),
            Param::Blobs(v) => Owned::Blobs(v.iter().map(|b| b.map(<[u8]>::to_vec)).collect()),
        }
    }
}

/// The borrowed element lists of an array parameter, built before the [`Param`]s that point into them.
enum View<'a> {
    Scalar(Param<'a>),
    Texts(Vec<Option<&'a str>>),
    Ints(&'a [Option<i64>]),
    Blobs(Vec<Option<&'a [u8]>>),
}

impl<'a> View<'a> {
    fn of(o: &'a Owned) -> View<'a> {
        match o {
            Owned::Null => View::Scalar(Param::Null),
            Owned::Int(i) => View::Scalar(Param::Int(*i)),
            Owned::Real(f) => View::Scalar(Param::Real(*f)),
            Owned::Text(s) => View::Scalar(Param::Text(s)),
            Owned::Blob(b) => View::Scalar(Param::Blob(b)),
            Owned::Texts(v) => View::Texts(v.iter().map(Option::as_deref).collect()),
            Owned::Ints(v) => View::Ints(v),
            Owned::Blobs(v) => View::Blobs(v.iter().map(Option::as_deref).collect()),
        }
    }

    fn param(&self) -> Param<'_> {
        match self {
            View::Scalar(p) => *p,
            View::Texts(v) => Param::Texts(v),
            View::Ints(v) => Param::Ints(v),
            View::Blobs(v) => Param::Blobs(v),
        }
    }
}

/// Statements queued in order, to be sent with one [`Db::exec_many`] (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Pipeline {
    statements: Vec<(String, Vec<Owned>)>,
}

impl Pipeline {
    /// An empty queue.
    pub(crate) fn new() -> Pipeline {
        Pipeline::default()
    }

    /// Queues `sql` with `params` (copied); returns its index in the counts of [`Pipeline::send`].
    pub(crate) fn push(&mut self, sql: impl Into<String>, params: &[Param<'_>]) -> usize {
        self.statements
            .push((sql.into(), params.iter().map(Owned::of).collect()));
        self.statements.len() - 1
    }

    /// Sends every queued statement, in order, with one [`Db::exec_many`]; each one's row count, in push
    /// order (nothing is sent and `[]` returned when the queue is empty). Errors: the first failing
    /// statement's, as [`Db::exec_many`]'s; the caller's transaction is then rolled back.
    pub(crate) fn send(self, c: &dyn Db) -> StoreResult<Vec<u64>> {
        if self.statements.is_empty() {
            return Ok(Vec::new());
        }
        let views: Vec<Vec<View<'_>>> = self
            .statements
            .iter()
            .map(|(_, ps)| ps.iter().map(View::of).collect())
            .collect();
        let params: Vec<Vec<Param<'_>>> = views
            .iter()
            .map(|vs| vs.iter().map(View::param).collect())
            .collect();
        let statements: Vec<(&str, &[Param<'_>])> = self
            .statements
            .iter()
            .zip(&params)
            .map(|((sql, _), ps)| (sql.as_str(), &ps[..]))
            .collect();
        c.exec_many(&statements)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p;

    #[test]
    fn queued_statements_run_in_order_with_their_copied_parameters() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let c: &dyn Db = &conn;
        c.exec(
            "CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER, b BLOB)",
            p![],
        )
        .unwrap();
        let mut q = Pipeline::new();
        {
            // The parameters' sources end here; the queue keeps copies.
            let key = String::from("a");
            let blob = vec![1u8, 2];
            q.push(
                "INSERT INTO t (k, n, b) VALUES (?1, ?2, ?3)",
                p![key, 7, blob],
            );
        }
        let fenced = q.push("UPDATE t SET n = n + 1 WHERE k = ?1", p!["a"]);
        let missed = q.push("UPDATE t SET n = 0 WHERE k = ?1", p!["nobody"]);
        let counts = q.send(c).unwrap();
        assert_eq!(counts, vec![1, 1, 0]);
        assert_eq!((counts[fenced], counts[missed]), (1, 0));
        let (n, b): (i64, Vec<u8>) = c
            .row("SELECT n, b FROM t WHERE k = 'a'", p![], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap()
            .unwrap();
        assert_eq!((n, b), (8, vec![1, 2]));
        assert_eq!(Pipeline::new().send(c).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn array_parameters_keep_their_elements_and_nulls() {
        let texts = [Some("x"), None];
        let ints = [Some(3i64), None];
        let blobs: [Option<&[u8]>; 2] = [None, Some(&[9])];
        let owned: Vec<Owned> = [
            Param::Texts(&texts),
            Param::Ints(&ints),
            Param::Blobs(&blobs),
        ]
        .iter()
        .map(Owned::of)
        .collect();
        let views: Vec<View<'_>> = owned.iter().map(View::of).collect();
        let back: Vec<Param<'_>> = views.iter().map(View::param).collect();
        assert_eq!(
            back,
            vec![
                Param::Texts(&texts),
                Param::Ints(&ints),
                Param::Blobs(&blobs)
            ]
        );
    }
}
