//! The PostgreSQL adapter on a real server: migrations (idempotent, and once under a race of three
//! processes' worth of clients), the schema against SQLite's, parameter and column conversions, the
//! statement cache, row locks under a real race, deadlock retries, panics, a full queue, lock and
//! connection errors. Each test works in a fresh schema of its own ([`TestDatabase`]) and skips, with a
//! printed reason, only when PostgreSQL cannot be reached and `CI` is unset.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use trigger_bridge_store::p;
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{self as pg, PgPool, PoolOptions};
use trigger_bridge_store::sql::{Db, Param, Value};
use trigger_bridge_store::StoreError;

/// Upper bound of every wait in this file.
const BOUND: Duration = Duration::from_secs(10);

fn client(db: &TestDatabase) -> postgres::Client {
    pg::connect(&db.config()).expect("connect to the test schema")
}

fn pool(db: &TestDatabase, connections: usize, queue_capacity: usize) -> Arc<PgPool> {
    let opts = PoolOptions {
        connections,
        queue_capacity,
    };
    Arc::new(PgPool::start(&db.config(), opts).expect("pool starts"))
}

/// Runs the blocking `f` off the async runtime (the synchronous driver must not run on it).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::time::timeout(BOUND, tokio::task::spawn_blocking(f))
        .await
        .expect("bounded")
        .expect("no panic")
}

fn exec_all(d: &dyn Db, sql: &[&str]) -> Result<(), StoreError> {
    for s in sql {
        d.exec(s, p![])?;
    }
    Ok(())
}

#[test]
fn migrations_apply_once_then_are_a_no_op() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let mut c = client(&db);
    assert_eq!(pg::schema_version(&mut c).unwrap(), 0);
    let latest = pg::MIGRATIONS.last().unwrap().0;
    assert_eq!(pg::migrate(&mut c).unwrap(), (0, latest));
    assert_eq!(pg::migrate(&mut c).unwrap(), (latest, latest));
    assert_eq!(pg::schema_version(&mut c).unwrap(), latest);
    let rows: i64 = c
        .query_one("SELECT COUNT(*) FROM schema_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, pg::MIGRATIONS.len() as i64);
    // The tables are in the test's own schema (the URL's search_path), nowhere else.
    let schema: String = c
        .query_one(
            "SELECT table_schema::TEXT FROM information_schema.tables WHERE table_name = 'receipts' \
             AND table_schema = current_schema()",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(schema, db.schema());
}

/// Receipts leave room on their pages so that their one update (the settled state) stays a heap-only
/// tuple (migration 0016): checked on the table the migrations made.
#[test]
fn receipts_pages_keep_room_for_their_update() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let mut c = client(&db);
    pg::migrate(&mut c).unwrap();
    let options: Vec<String> = c
        .query_one(
            "SELECT COALESCE(reloptions, '{}')::TEXT[] FROM pg_class \
             WHERE oid = to_regclass(current_schema() || '.receipts')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(options, vec!["fillfactor=70".to_string()]);
}

#[test]
fn concurrent_migrations_from_three_clients_apply_once_and_none_fails() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let latest = pg::MIGRATIONS.last().unwrap().0;
    // Connect first, so nothing can fail between the threads' start and the barrier.
    let clients: Vec<postgres::Client> = (0..3).map(|_| client(&db)).collect();
    let barrier = Arc::new(Barrier::new(3));
    let threads: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                pg::migrate(&mut c)
            })
        })
        .collect();
    let mut results: Vec<(i64, i64)> = threads
        .into_iter()
        .map(|t| t.join().expect("no panic").expect("no migration fails"))
        .collect();
    results.sort();
    // Each version is its own transaction, so a caller may find some versions applied and apply the
    // rest: every caller ends at the latest, exactly one found none applied, none went backwards.
    assert!(results.iter().all(|r| r.1 == latest), "{results:?}");
    assert_eq!(
        results.iter().filter(|r| r.0 == 0).count(),
        1,
        "{results:?}"
    );
    assert!(results.iter().all(|r| r.0 <= r.1), "{results:?}");
    let rows: i64 = client(&db)
        .query_one("SELECT COUNT(*) FROM schema_migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, pg::MIGRATIONS.len() as i64);
}

/// Columns `(name, type)` of each table, by table name.
type Tables = BTreeMap<String, Vec<(String, String)>>;

/// Table -> columns in order, with the SQLite declared type, from a migrated in-memory SQLite database.
fn sqlite_schema() -> (Tables, BTreeSet<String>) {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    trigger_bridge_store::sqlite::migrate(&conn).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = BTreeMap::new();
    for t in tables {
        let cols: Vec<(String, String)> = conn
            .prepare(&format!("PRAGMA table_info({t})"))
            .unwrap()
            .query_map([], |r| Ok((r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        out.insert(t, cols);
    }
    let indexes: BTreeSet<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%'",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    (out, indexes)
}

#[test]
fn the_schema_has_sqlites_tables_columns_and_indexes() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let mut c = client(&db);
    pg::migrate(&mut c).unwrap();
    let mut tables = Tables::new();
    for r in c
        .query(
            "SELECT table_name::TEXT, column_name::TEXT, data_type::TEXT \
             FROM information_schema.columns WHERE table_schema = current_schema() \
             AND table_name <> 'schema_migrations' ORDER BY table_name, ordinal_position",
            &[],
        )
        .unwrap()
    {
        tables
            .entry(r.get(0))
            .or_default()
            .push((r.get(1), r.get(2)));
    }
    let (sqlite, sqlite_indexes) = sqlite_schema();
    assert_eq!(
        tables.keys().collect::<Vec<_>>(),
        sqlite.keys().collect::<Vec<_>>()
    );
    for (t, cols) in &sqlite {
        let expected: Vec<(String, String)> = cols
            .iter()
            .map(|(name, ty)| {
                let pg_ty = match ty.as_str() {
                    "INTEGER" => "bigint",
                    "TEXT" => "text",
                    "BLOB" => "bytea",
                    other => panic!("{t}.{name}: unexpected SQLite type {other}"),
                };
                (name.clone(), pg_ty.to_string())
            })
            .collect();
        assert_eq!(&tables[t], &expected, "columns of {t}");
    }
    // Named indexes are the same (keys and UNIQUE constraints are compared through the probes below).
    let indexes: BTreeSet<String> = c
        .query(
            "SELECT indexname::TEXT FROM pg_indexes WHERE schemaname = current_schema() \
             AND indexname NOT LIKE '%_pkey' AND indexname NOT LIKE '%_key'",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(indexes, sqlite_indexes);
    // The partial unique index keeps one live receipt per dedup key, and lets a released one be.
    let insert =
        "INSERT INTO receipts (id, subscription_id, dedup_key, provider_event_id, event_type, \
                  normalized, state, body_bytes, received_at, updated_at, dedup_until, dedup_live) \
                  VALUES ($1, 's', 'k', 'e', 't', '{}', 'routed', 0, 0, 0, 0, $2)";
    c.execute(insert, &[&"r1", &1i64]).unwrap();
    let e = c.execute(insert, &[&"r2", &1i64]).unwrap_err();
    assert!(
        matches!(pg::classify(&e), StoreError::Database(ref m) if m.contains("23505") && m.contains("receipts_dedup")),
        "{e}"
    );
    c.execute(insert, &[&"r3", &0i64]).unwrap();
    let e = c
        .execute(
            "INSERT INTO waits (id, run_id, spec, state, created_at) VALUES ('w1', 'r', '{}', 'armed', 0), \
             ('w2', 'r', '{}', 'armed', 0)",
            &[],
        )
        .unwrap_err();
    let e = pg::classify(&e).to_string();
    assert!(e.contains("waits_one_armed"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn params_and_values_round_trip_every_type() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    let rows = pool
        .write(|d| {
            exec_all(
                d,
                &["CREATE TABLE typed (i8 BIGINT, i4 INTEGER, i2 SMALLINT, b BOOLEAN, f8 DOUBLE PRECISION, \
                   f4 REAL, t TEXT, v VARCHAR(16), c CHAR(3), y BYTEA)"],
            )?;
            d.exec(
                "INSERT INTO typed VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                p![
                    i64::MIN,
                    -2_147_483_648i64,
                    32_767i64,
                    true,
                    1.5f64,
                    Param::Real(0.25),
                    "héllo",
                    "varchar",
                    "abc",
                    vec![0u8, 1, 255]
                ],
            )?;
            d.exec(
                "INSERT INTO typed VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                p![
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null,
                    Param::Null
                ],
            )?;
            d.query(
                "SELECT i8, i4, i2, b, f8, f4, t, v, c, y FROM typed ORDER BY i8 NULLS LAST",
                p![],
            )
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0].0,
        vec![
            Value::Int(i64::MIN),
            Value::Int(-2_147_483_648),
            Value::Int(32_767),
            Value::Int(1),
            Value::Real(1.5),
            Value::Real(0.25),
            Value::Text("héllo".into()),
            Value::Text("varchar".into()),
            Value::Text("abc".into()),
            Value::Blob(vec![0, 1, 255]),
        ]
    );
    assert_eq!(rows[1].0, vec![Value::Null; 10]);
    assert!(rows[0].get::<bool>(3).unwrap());

    // An integer that does not fit its column, a flag that is not 0/1 and a wrong type are refused.
    for (sql, param, want) in [
        (
            "INSERT INTO typed (i4) VALUES (?1)",
            Param::Int(1 << 40),
            "does not fit",
        ),
        (
            "INSERT INTO typed (i2) VALUES (?1)",
            Param::Int(40_000),
            "does not fit",
        ),
        (
            "INSERT INTO typed (b) VALUES (?1)",
            Param::Int(2),
            "does not fit",
        ),
        (
            "INSERT INTO typed (i8) VALUES (?1)",
            Param::Text("7"),
            "cannot bind text",
        ),
        (
            "INSERT INTO typed (t) VALUES (?1)",
            Param::Int(7),
            "cannot bind an integer",
        ),
        (
            "INSERT INTO typed (y) VALUES (?1)",
            Param::Text("x"),
            "cannot bind text",
        ),
    ] {
        let sql = sql.to_string();
        let e = pool
            .write(move |d| d.exec(&sql, &[param]))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Database(m) if m.contains(want)),
            "{param:?}: {e}"
        );
    }
    // A column type with no store value names itself and the fix.
    let e = pool
        .read(|d| d.query("SELECT SUM(i8) FROM typed", p![]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("numeric") && m.contains("cast it")),
        "{e}"
    );
    let sum = pool
        .read(|d| d.value::<i64>("SELECT CAST(SUM(i2) AS BIGINT) FROM typed", p![]))
        .await
        .unwrap();
    assert_eq!(sum, Some(32_767));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_may_be_used_twice_and_statements_are_prepared_once() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    let (pair, prepared) = pool
        .write(|d| {
            exec_all(d, &["CREATE TABLE pairs (a BIGINT, b BIGINT, note TEXT)"])?;
            for i in 0..3i64 {
                d.exec(
                    "INSERT INTO pairs (a, b, note) VALUES (?1, ?1, ?2) /* twice */",
                    p![i, "literal ?3 stays"],
                )?;
            }
            let pair = d.query(
                "SELECT a, b, note FROM pairs WHERE a = ?1 AND b = ?1",
                p![2i64],
            )?;
            let prepared = d.value::<i64>(
                "SELECT COUNT(*) FROM pg_prepared_statements WHERE statement LIKE '%/* tw' || 'ice */%'",
                p![],
            )?;
            Ok((pair, prepared))
        })
        .await
        .unwrap();
    assert_eq!(
        pair[0].0,
        vec![
            Value::Int(2),
            Value::Int(2),
            Value::Text("literal ?3 stays".into())
        ]
    );
    assert_eq!(prepared, Some(1), "three inserts, one prepared statement");
    // The cache lives with the connection: a later transaction reuses the statement.
    let prepared = pool
        .write(|d| {
            d.exec(
                "INSERT INTO pairs (a, b, note) VALUES (?1, ?1, ?2) /* twice */",
                p![9i64, "x"],
            )?;
            d.value::<i64>(
                "SELECT COUNT(*) FROM pg_prepared_statements WHERE statement LIKE '%/* tw' || 'ice */%'",
                p![],
            )
        })
        .await
        .unwrap();
    assert_eq!(prepared, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_gone_stale_after_a_schema_change_is_prepared_again() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    let select = |pool: Arc<PgPool>| async move {
        pool.read(|d| d.query("SELECT * FROM evolving", p![])).await
    };
    pool.write(|d| {
        exec_all(
            d,
            &[
                "CREATE TABLE evolving (a BIGINT)",
                "INSERT INTO evolving VALUES (1)",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        select(pool.clone()).await.unwrap()[0].0,
        vec![Value::Int(1)]
    );
    // A newer replica adds a column: the cached `SELECT *` now has another result type.
    pool.write(|d| exec_all(d, &["ALTER TABLE evolving ADD COLUMN b TEXT DEFAULT 'x'"]))
        .await
        .unwrap();
    assert_eq!(
        select(pool.clone()).await.unwrap()[0].0,
        vec![Value::Int(1), Value::Text("x".into())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_writers_locking_one_counter_lose_no_update() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 4, 64);
    pool.write(|d| {
        exec_all(
            d,
            &[
                "CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
                "INSERT INTO counter VALUES (1, 0)",
            ],
        )
    })
    .await
    .unwrap();
    let worker = |pool: Arc<PgPool>| async move {
        let mut seen = Vec::with_capacity(200);
        for _ in 0..200 {
            let n = pool
                .write(|d| {
                    let sql = format!(
                        "SELECT n FROM counter WHERE id = 1{}",
                        d.dialect().for_update()
                    );
                    let n: i64 = d.value(&sql, p![])?.expect("the counter row");
                    d.exec("UPDATE counter SET n = ?1 WHERE id = 1", p![n + 1])?;
                    Ok(n)
                })
                .await
                .expect("write");
            seen.push(n);
        }
        seen
    };
    let (a, b) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(
            tokio::spawn(worker(pool.clone())),
            tokio::spawn(worker(pool.clone()))
        )
    })
    .await
    .expect("bounded");
    let (a, b) = (a.unwrap(), b.unwrap());
    let total = pool
        .read(|d| d.value::<i64>("SELECT n FROM counter WHERE id = 1", p![]))
        .await
        .unwrap();
    assert_eq!(total, Some(400));
    // Every value was read exactly once: no two transactions decided from the same snapshot.
    let all: BTreeSet<i64> = a.iter().chain(&b).copied().collect();
    assert_eq!(all, (0..400).collect::<BTreeSet<i64>>());
    // And they really raced: the two writers' values interleave.
    assert!(
        a.iter().max() > b.iter().min() && b.iter().max() > a.iter().min(),
        "the writers ran one after the other"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_is_retried_and_both_jobs_succeed() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 2, 16);
    pool.write(|d| {
        exec_all(
            d,
            &[
                "CREATE TABLE locks (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
                "INSERT INTO locks VALUES (1, 0), (2, 0)",
            ],
        )
    })
    .await
    .unwrap();
    // Each job locks its first row, waits until the other locked its own, then takes the other's:
    // on the first run they deadlock; PostgreSQL aborts one (40P01) and the pool runs it again.
    let (a_tx, a_rx) = std_mpsc::channel::<()>();
    let (b_tx, b_rx) = std_mpsc::channel::<()>();
    let runs = Arc::new(AtomicUsize::new(0));
    let job =
        |first: i64, second: i64, tell: std_mpsc::Sender<()>, wait: std_mpsc::Receiver<()>| {
            let runs = runs.clone();
            let mut run = 0;
            move |d: &dyn Db| {
                run += 1;
                runs.fetch_add(1, Ordering::SeqCst);
                d.exec("UPDATE locks SET n = n + 1 WHERE id = ?1", p![first])?;
                if run == 1 {
                    let _ = tell.send(());
                    wait.recv_timeout(BOUND)
                        .map_err(|_| StoreError::Database("the other job did not lock".into()))?;
                }
                d.exec("UPDATE locks SET n = n + 1 WHERE id = ?1", p![second])?;
                Ok(run)
            }
        };
    let ja = job(1, 2, a_tx, b_rx);
    let jb = job(2, 1, b_tx, a_rx);
    let (ra, rb) = tokio::time::timeout(BOUND, async {
        tokio::join!(pool.write(ja), pool.write(jb))
    })
    .await
    .expect("bounded");
    let (ra, rb) = (ra.expect("job a"), rb.expect("job b"));
    let mut by_runs = [ra, rb];
    by_runs.sort();
    assert_eq!(
        by_runs,
        [1, 2],
        "one job ran once, the deadlock victim twice"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let ns = pool
        .read(|d| d.rows("SELECT n FROM locks ORDER BY id", p![], |r| r.get::<i64>(0)))
        .await
        .unwrap();
    assert_eq!(
        ns,
        vec![2, 2],
        "both jobs committed, the victim's first run rolled back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_is_retried_on_a_fresh_snapshot() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 2, 16);
    pool.write(|d| {
        exec_all(
            d,
            &[
                "CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
                "INSERT INTO counter VALUES (1, 0)",
            ],
        )
    })
    .await
    .unwrap();
    // Job A reads under REPEATABLE READ, then (first run only) waits while another job updates the
    // row and commits: A's update then fails with 40001, and its second run reads the new value.
    let (read_tx, read_rx) = std_mpsc::channel::<()>();
    let (go_tx, go_rx) = std_mpsc::channel::<()>();
    let mut run = 0;
    let a = pool.write(move |d| {
        run += 1;
        d.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", p![])?;
        let n: i64 = d
            .value("SELECT n FROM counter WHERE id = 1", p![])?
            .unwrap();
        if run == 1 {
            let _ = read_tx.send(());
            go_rx
                .recv_timeout(BOUND)
                .map_err(|_| StoreError::Database("no go".into()))?;
        }
        d.exec("UPDATE counter SET n = ?1 WHERE id = 1", p![n + 10])?;
        Ok((run, n))
    });
    let mut a = Box::pin(a);
    assert!(poll_once(a.as_mut()).is_pending());
    blocking(move || read_rx.recv_timeout(BOUND).expect("a read")).await;
    pool.write(|d| d.exec("UPDATE counter SET n = n + 1 WHERE id = 1", p![]))
        .await
        .unwrap();
    go_tx.send(()).unwrap();
    let (runs, seen) = tokio::time::timeout(BOUND, a).await.unwrap().unwrap();
    assert_eq!((runs, seen), (2, 1), "retried once, on the committed value");
    let n = pool
        .read(|d| d.value::<i64>("SELECT n FROM counter WHERE id = 1", p![]))
        .await
        .unwrap();
    assert_eq!(n, Some(11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_keeps_losing_gets_retryable_after_five_retries() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let e = pool
        .write(move |_d| -> Result<(), StoreError> {
            r.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Retryable("lost again".into()))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e, StoreError::Retryable(ref m) if m == "lost again"),
        "{e}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1 + trigger_bridge_store::postgres::pool::MAX_RETRIES as usize
    );
    // Any other error is not retried.
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let e = pool
        .write(move |_d| -> Result<(), StoreError> {
            r.fetch_add(1, Ordering::SeqCst);
            Err(StoreError::Conflict("no".into()))
        })
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Conflict(_)), "{e}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_job_is_rolled_back_and_the_pool_goes_on() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    pool.write(|d| exec_all(d, &["CREATE TABLE notes (id BIGINT PRIMARY KEY)"]))
        .await
        .unwrap();
    let e = pool
        .write(|d| -> Result<(), StoreError> {
            d.exec("INSERT INTO notes VALUES (1)", p![])?;
            panic!("boom in a job");
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("panicked") && m.contains("boom in a job")),
        "{e}"
    );
    assert_eq!(pool.live_connections(), 1);
    // The same (only) connection goes on, and the panicking job's insert was rolled back.
    let ids = pool
        .write(|d| {
            d.exec("INSERT INTO notes VALUES (2)", p![])?;
            d.rows("SELECT id FROM notes ORDER BY id", p![], |r| {
                r.get::<i64>(0)
            })
        })
        .await
        .unwrap();
    assert_eq!(ids, vec![2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_busy_at_once() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 1);
    // Occupy the only connection until released.
    let (started_tx, started_rx) = std_mpsc::channel::<()>();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let holder = {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.write(move |_d| {
                let _ = started_tx.send(());
                release_rx
                    .recv_timeout(BOUND)
                    .map_err(|_| StoreError::Database("not released".into()))
            })
            .await
        })
    };
    blocking(move || started_rx.recv_timeout(BOUND).expect("holder started")).await;
    // One more job fits in the queue; the next is refused at once (both enqueue on their first poll).
    let mut queued = Box::pin(pool.write(|d| d.value::<i64>("SELECT 7", p![])));
    assert!(poll_once(queued.as_mut()).is_pending());
    let refused = poll_once(std::pin::pin!(
        pool.write(|d| d.value::<i64>("SELECT 8", p![]))
    ));
    let Poll::Ready(Err(refused)) = refused else {
        panic!("a job beyond the queue was not refused: {refused:?}");
    };
    assert!(
        matches!(refused, StoreError::Busy(ref m) if m.contains("full")),
        "{refused}"
    );
    release_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();
    let seven = tokio::time::timeout(BOUND, queued).await.expect("bounded");
    assert_eq!(seven.unwrap(), Some(7));
}

/// Polls a future once, without a waker (it is polled again by `.await` later, or dropped).
fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_elsewhere_is_busy_with_nowait_and_a_read_job_cannot_write() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 2, 16);
    pool.write(|d| {
        exec_all(
            d,
            &[
                "CREATE TABLE held (id BIGINT PRIMARY KEY)",
                "INSERT INTO held VALUES (1)",
            ],
        )
    })
    .await
    .unwrap();
    let (locked_tx, locked_rx) = std_mpsc::channel::<()>();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let holder = {
        let pool = pool.clone();
        tokio::spawn(async move {
            pool.write(move |d| {
                d.exec("SELECT id FROM held WHERE id = 1 FOR UPDATE", p![])?;
                let _ = locked_tx.send(());
                release_rx
                    .recv_timeout(BOUND)
                    .map_err(|_| StoreError::Database("not released".into()))
            })
            .await
        })
    };
    blocking(move || locked_rx.recv_timeout(BOUND).expect("row locked")).await;
    let e = pool
        .write(|d| d.exec("SELECT id FROM held WHERE id = 1 FOR UPDATE NOWAIT", p![]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Busy(m) if m.contains("55P03")),
        "{e}"
    );
    release_tx.send(()).unwrap();
    holder.await.unwrap().unwrap();

    let e = pool
        .read(|d| d.exec("INSERT INTO held VALUES (2)", p![]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("25006")),
        "{e}"
    );
    let e = pool
        .write(|d| d.exec("INSERT INTO held VALUES (1)", p![]))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("23505") && m.contains("held_pkey")),
        "{e}"
    );
    pool.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_is_replaced_before_the_next_job() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    let pid = pool
        .read(|d| d.value::<i64>("SELECT CAST(pg_backend_pid() AS BIGINT)", p![]))
        .await
        .unwrap()
        .unwrap();
    let cfg = db.config();
    let killed = blocking(move || {
        let mut c = pg::connect(&cfg).unwrap();
        c.query_one(
            "SELECT pg_terminate_backend(CAST($1 AS BIGINT)::INT)",
            &[&pid],
        )
        .unwrap()
        .get::<_, bool>(0)
    })
    .await;
    assert!(killed);
    // The server closes the session at once; the pool notices at the next BEGIN and reconnects.
    let new_pid = tokio::time::timeout(
        BOUND,
        pool.read(|d| d.value::<i64>("SELECT CAST(pg_backend_pid() AS BIGINT)", p![])),
    )
    .await
    .expect("bounded")
    .expect("the job ran on a new connection")
    .unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(pool.live_connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_runs_what_is_queued_then_refuses() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 64);
    pool.write(|d| exec_all(d, &["CREATE TABLE done (id BIGINT PRIMARY KEY)"]))
        .await
        .unwrap();
    // The only connection is held while 20 jobs queue up behind it and the pool is closed.
    let (started_tx, started_rx) = std_mpsc::channel::<()>();
    let (release_tx, release_rx) = std_mpsc::channel::<()>();
    let mut holder = Box::pin(pool.write(move |_d| {
        let _ = started_tx.send(());
        release_rx
            .recv_timeout(BOUND)
            .map_err(|_| StoreError::Database("not released".into()))
    }));
    assert!(poll_once(holder.as_mut()).is_pending());
    blocking(move || started_rx.recv_timeout(BOUND).expect("holder started")).await;
    let mut jobs: Vec<_> = (0..20i64)
        .map(|i| Box::pin(pool.write(move |d| d.exec("INSERT INTO done VALUES (?1)", p![i]))))
        .collect();
    for j in &mut jobs {
        assert!(poll_once(j.as_mut()).is_pending(), "queued");
    }
    let closing = tokio::spawn({
        let pool = pool.clone();
        async move { pool.close().await }
    });
    // Once closing began, nothing more is taken (a job polled before that is queued and runs).
    let refused = tokio::time::timeout(BOUND, async {
        loop {
            let probe = poll_once(std::pin::pin!(pool.write(|d| d.exec("SELECT 1", p![]))));
            match probe {
                Poll::Ready(Err(StoreError::Unavailable(m))) => break m,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await
    .expect("closing refuses new jobs");
    assert!(refused.contains("closed"), "{refused}");
    release_tx.send(()).unwrap();
    tokio::time::timeout(BOUND, holder).await.unwrap().unwrap();
    for j in jobs {
        assert_eq!(tokio::time::timeout(BOUND, j).await.unwrap().unwrap(), 1);
    }
    tokio::time::timeout(BOUND, closing).await.unwrap().unwrap();
    assert_eq!(pool.live_connections(), 0);
    let c = blocking({
        let cfg = db.config();
        move || {
            pg::connect(&cfg)
                .unwrap()
                .query_one("SELECT COUNT(*) FROM done", &[])
                .unwrap()
                .get::<_, i64>(0)
        }
    })
    .await;
    assert_eq!(c, 20);
}

#[test]
fn a_bad_url_or_an_unreachable_server_is_a_typed_error() {
    let e = pg::parse_url("postgres://u@h:notaport/db").unwrap_err();
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("invalid PostgreSQL URL")),
        "{e}"
    );
    // Port 1 on loopback: nothing listens; refused at once.
    let cfg = pg::parse_url("postgres://postgres@127.0.0.1:1/test?connect_timeout=2").unwrap();
    let e = PgPool::start(&cfg, PoolOptions::default())
        .err()
        .expect("no server");
    assert!(matches!(&e, StoreError::Unavailable(_)), "{e}");
    let with_path = pg::testing::with_search_path("postgres://u@h/db?sslmode=disable", "s1");
    assert_eq!(
        with_path,
        "postgres://u@h/db?sslmode=disable&options=-c%20search_path%3Ds1"
    );
    let cfg = pg::parse_url(&with_path).unwrap();
    assert_eq!(cfg.get_options(), Some("-c search_path=s1"));
    assert_eq!(cfg.get_application_name(), Some("trigger-bridge"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_migrates_then_serves() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let url = db.url().to_string();
    let opts = PoolOptions {
        connections: 2,
        queue_capacity: 8,
    };
    let pool = blocking(move || pg::open(&url, opts)).await.expect("open");
    assert_eq!(pool.live_connections(), 2);
    let version = pool
        .read(|d| d.value::<i64>("SELECT MAX(version) FROM schema_migrations", p![]))
        .await
        .unwrap();
    assert_eq!(version, Some(pg::MIGRATIONS.last().unwrap().0));
    let n = pool
        .read(|d| d.value::<i64>("SELECT COUNT(*) FROM receipts", p![]))
        .await
        .unwrap();
    assert_eq!(n, Some(0));
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_many_returns_each_row_count_in_order() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    let (counts, rows) = pool
        .write(|d| {
            exec_all(
                d,
                &["CREATE TABLE many (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)"],
            )?;
            let counts = d.exec_many(&[
                ("INSERT INTO many VALUES (?1, ?2)", p![1i64, 10i64]),
                (
                    "INSERT INTO many VALUES (?1, 0), (?2, 0), (?3, 0)",
                    p![2i64, 3i64, 4i64],
                ),
                ("UPDATE many SET n = n + 1 WHERE id > ?1", p![99i64]),
                ("DELETE FROM many WHERE id IN (?1, ?2)", p![3i64, 4i64]),
                // Runs after the insert above: sees its row.
                ("UPDATE many SET n = n * ?1 WHERE id = 1", p![3i64]),
            ])?;
            let rows = d.rows("SELECT id, n FROM many ORDER BY id", p![], |r| {
                Ok((r.get::<i64>(0)?, r.get::<i64>(1)?))
            })?;
            Ok((counts, rows))
        })
        .await
        .unwrap();
    assert_eq!(counts, vec![1, 3, 0, 2, 1]);
    assert_eq!(rows, vec![(1, 30), (2, 0)]);
    // No statement: an empty answer, and the job commits nothing.
    let none = pool.write(|d| d.exec_many(&[])).await.unwrap();
    assert_eq!(none, Vec::<u64>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_in_the_middle_of_exec_many_rolls_back_the_whole_job() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    pool.write(|d| exec_all(d, &["CREATE TABLE uniq (id BIGINT PRIMARY KEY)"]))
        .await
        .unwrap();
    let e = pool
        .write(|d| {
            d.exec("INSERT INTO uniq VALUES (1)", p![])?;
            d.exec_many(&[
                ("INSERT INTO uniq VALUES (?1)", p![2i64]),
                ("INSERT INTO uniq VALUES (?1)", p![1i64]),
                ("INSERT INTO uniq VALUES (?1)", p![3i64]),
            ])
        })
        .await
        .unwrap_err();
    // The first failure in order is the error (not the 25P02 "aborted" of the statement after it).
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("23505") && m.contains("uniq_pkey")),
        "{e}"
    );
    let ids = pool
        .write(|d| {
            d.exec("INSERT INTO uniq VALUES (9)", p![])?;
            d.rows("SELECT id FROM uniq ORDER BY id", p![], |r| r.get::<i64>(0))
        })
        .await
        .unwrap();
    assert_eq!(
        ids,
        vec![9],
        "nothing of the failed job stayed; the pool goes on"
    );
    // In autocommit every statement was sent before the first answer was read: the one after the
    // failure ran (and committed on its own), which one by one it would not have been.
    let e = pool
        .read_point(|d| {
            d.exec_many(&[
                ("INSERT INTO uniq VALUES (?1)", p![9i64]),
                ("INSERT INTO uniq VALUES (?1)", p![10i64]),
            ])
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StoreError::Database(m) if m.contains("23505")),
        "{e}"
    );
    let ids = pool
        .read(|d| d.rows("SELECT id FROM uniq ORDER BY id", p![], |r| r.get::<i64>(0)))
        .await
        .unwrap();
    assert_eq!(ids, vec![9, 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_mid_pipeline_is_unavailable_and_replaced() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 1, 16);
    pool.write(|d| exec_all(d, &["CREATE TABLE lost (id BIGINT PRIMARY KEY)"]))
        .await
        .unwrap();
    let pid = |pool: Arc<PgPool>| async move {
        pool.read(|d| d.value::<i64>("SELECT CAST(pg_backend_pid() AS BIGINT)", p![]))
            .await
            .unwrap()
            .unwrap()
    };
    let before = pid(pool.clone()).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let e = tokio::time::timeout(
        BOUND,
        pool.write(move |d| {
            r.fetch_add(1, Ordering::SeqCst);
            d.exec_many(&[
                ("INSERT INTO lost VALUES (?1)", p![1i64]),
                ("SELECT pg_terminate_backend(pg_backend_pid())", p![]),
                ("INSERT INTO lost VALUES (?1)", p![2i64]),
            ])
        }),
    )
    .await
    .expect("bounded")
    .unwrap_err();
    assert!(matches!(&e, StoreError::Unavailable(_)), "{e}");
    // Its fate could have been unknown (a COMMIT's answer lost): not run again.
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let after = pid(pool.clone()).await;
    assert_ne!(after, before, "the next job ran on a new connection");
    assert_eq!(pool.live_connections(), 1);
    let n = pool
        .read(|d| d.value::<i64>("SELECT COUNT(*) FROM lost", p![]))
        .await
        .unwrap();
    assert_eq!(n, Some(0), "the dropped transaction wrote nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_inside_exec_many_is_retried() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let pool = pool(&db, 2, 16);
    pool.write(|d| {
        exec_all(
            d,
            &[
                "CREATE TABLE counter (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
                "INSERT INTO counter VALUES (1, 0)",
                "CREATE TABLE seen (run BIGINT, n BIGINT)",
            ],
        )
    })
    .await
    .unwrap();
    // As `a_serialization_failure_is_retried_on_a_fresh_snapshot`, with A's writes pipelined: its
    // update fails with 40001, the insert after it with 25P02, and the job runs again whole.
    let (read_tx, read_rx) = std_mpsc::channel::<()>();
    let (go_tx, go_rx) = std_mpsc::channel::<()>();
    let mut run = 0i64;
    let a = pool.write(move |d| {
        run += 1;
        d.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", p![])?;
        let n: i64 = d
            .value("SELECT n FROM counter WHERE id = 1", p![])?
            .unwrap();
        if run == 1 {
            let _ = read_tx.send(());
            go_rx
                .recv_timeout(BOUND)
                .map_err(|_| StoreError::Database("no go".into()))?;
        }
        let counts = d.exec_many(&[
            ("UPDATE counter SET n = ?1 WHERE id = 1", p![n + 10]),
            ("INSERT INTO seen VALUES (?1, ?2)", p![run, n]),
        ])?;
        Ok((run, n, counts))
    });
    let mut a = Box::pin(a);
    assert!(poll_once(a.as_mut()).is_pending());
    blocking(move || read_rx.recv_timeout(BOUND).expect("a read")).await;
    pool.write(|d| d.exec("UPDATE counter SET n = n + 1 WHERE id = 1", p![]))
        .await
        .unwrap();
    go_tx.send(()).unwrap();
    let got = tokio::time::timeout(BOUND, a).await.unwrap().unwrap();
    assert_eq!(
        got,
        (2, 1, vec![1, 1]),
        "retried once, on the committed value"
    );
    let seen = pool
        .read(|d| {
            d.rows("SELECT run, n FROM seen", p![], |r| {
                Ok((r.get::<i64>(0)?, r.get::<i64>(1)?))
            })
        })
        .await
        .unwrap();
    assert_eq!(seen, vec![(2, 1)], "the first run's insert was rolled back");
    let n = pool
        .read(|d| d.value::<i64>("SELECT n FROM counter WHERE id = 1", p![]))
        .await
        .unwrap();
    assert_eq!(n, Some(11));
}
