//! Test harness: a fresh PostgreSQL schema per test, dropped afterwards. Not for production use.
//!
//! `TB_TEST_DATABASE_URL` names the server and database (default
//! `postgres://postgres@127.0.0.1:5432/test`, then the same as user `root`); it must be in URL form.
//! When the server cannot be reached, [`TestDatabase::create`] prints why and returns `None` (the test
//! skips), unless the environment variable `CI` is set: then it panics, so CI never passes by skipping.

use std::time::Duration;

use super::config::{connect, parse_url};

/// The server tried when `TB_TEST_DATABASE_URL` is unset, in order.
pub const DEFAULT_URLS: &[&str] = &[
    "postgres://postgres@127.0.0.1:5432/test",
    "postgres://root@127.0.0.1:5432/test",
];

/// A schema `tb_test_<16 hex digits>` of its own, created by [`TestDatabase::create`] and dropped
/// (`CASCADE`) when this value is dropped.
pub struct TestDatabase {
    base: String,
    schema: String,
    url: String,
}

/// Runs `f` on a thread of its own: the synchronous driver must not run on a Tokio runtime thread,
/// and tests create and drop these from async code too.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().expect("test database thread panicked"))
}

impl TestDatabase {
    /// Connects to the test server, creates a fresh schema and returns it. `None` (after printing the
    /// reason to stderr) when the server cannot be reached and `CI` is unset. Panics: the server cannot
    /// be reached and `CI` is set, or the schema cannot be created.
    pub fn create() -> Option<TestDatabase> {
        let urls: Vec<String> = match std::env::var("TB_TEST_DATABASE_URL") {
            Ok(u) if !u.is_empty() => vec![u],
            _ => DEFAULT_URLS.iter().map(|s| s.to_string()).collect(),
        };
        let schema = format!("tb_test_{:016x}", super::random_u64());
        let mut errors = Vec::new();
        for base in urls {
            let made = off_runtime(|| -> Result<(), String> {
                let mut cfg = parse_url(&base).map_err(|e| e.to_string())?;
                cfg.connect_timeout(Duration::from_secs(3));
                let mut client = connect(&cfg).map_err(|e| e.to_string())?;
                client
                    .batch_execute(&format!("CREATE SCHEMA {schema}"))
                    .map_err(|e| panic!("cannot create test schema {schema}: {e}"))
            });
            match made {
                Ok(()) => {
                    let url = with_search_path(&base, &schema);
                    return Some(TestDatabase { base, schema, url });
                }
                Err(e) => errors.push(format!("{base}: {e}")),
            }
        }
        let why = format!("PostgreSQL unreachable ({})", errors.join("; "));
        if std::env::var_os("CI").is_some() {
            panic!("{why}; CI is set, so PostgreSQL tests must run");
        }
        eprintln!(
            "skipping PostgreSQL test: {why} (set TB_TEST_DATABASE_URL, or CI to fail instead)"
        );
        None
    }

    /// The URL of the test schema: the server's URL with `options=-c search_path=<schema>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Connection settings of the test schema (as [`parse_url`] gives them for [`TestDatabase::url`]).
    pub fn config(&self) -> tokio_postgres::Config {
        parse_url(&self.url).expect("test URL parses")
    }
}

/// `base` with `options=-c search_path=<schema>` added (percent-encoded) to its query string.
pub fn with_search_path(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (base, schema) = (&self.base, &self.schema);
        let r = off_runtime(|| -> Result<(), String> {
            let mut client =
                connect(&parse_url(base).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .map_err(|e| e.to_string())
        });
        if let Err(e) = r {
            eprintln!("could not drop test schema {schema}: {e}");
        }
    }
}
