//! `serve` and `migrate` on PostgreSQL: the real binary on a throwaway schema of the test
//! server (`TestDatabase`), webhooks signed by `trigger-bridge send`, `--role api` and `--role worker`
//! replicas sharing one database, the replica id in the log and as the lease owner, `/ready`'s store
//! facts, and the refusals (unreachable database, bad pool size) with the password masked.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_store::postgres::testing::TestDatabase;

mod common;

use common::*;

/// Longest wait for a server to answer `/health`, or for a state to be reached.
const WAIT: Duration = Duration::from_secs(20);

/// A `serve` child, killed on drop; its stderr (the log) goes to `log`.
struct Replica {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    /// Starts `serve --database-url URL` with `extra` flags and waits (at most [`WAIT`]) for `/health`.
    fn start(dir: &Path, config: &Path, url: &str, extra: &[&str]) -> Replica {
        Replica::start_logging(dir, config, url, extra, "info")
    }

    /// As [`Replica::start`], with `RUST_LOG=rust_log`.
    fn start_logging(
        dir: &Path,
        config: &Path,
        url: &str,
        extra: &[&str],
        rust_log: &str,
    ) -> Replica {
        let port = free_port();
        let log = dir.join(format!("serve-{port}.log"));
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(dir.join("data"))
            .args(["--database-url", url])
            .args(extra)
            .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
            .env("STANDARD_WEBHOOK_SECRET", SW_SECRET)
            .env_remove("TRIGGER_BRIDGE_DATABASE_URL")
            .env_remove("TRIGGER_BRIDGE_REPLICA_ID")
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn serve");
        let mut r = Replica {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let until = Instant::now() + WAIT;
        while Instant::now() < until {
            if let Some(status) = r.child.try_wait().unwrap() {
                panic!("serve exited with {status}: {}", r.log_text());
            }
            if ureq_get(&format!("{}/health", r.base)).is_some() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("serve not healthy within {WAIT:?}: {}", r.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str) -> (u16, Value) {
        get_status(&format!("{}{path}", self.base))
    }

    /// Polls `GET path` until `f` holds (at most [`WAIT`]); returns the last body.
    fn wait_for(&self, path: &str, f: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + WAIT;
        loop {
            let (_, v) = self.get(path);
            if f(&v) {
                return v;
            }
            assert!(
                Instant::now() < until,
                "condition on {path} not reached within {WAIT:?}; last: {v}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// Waits (at most [`WAIT`]) for `child` to exit: (exit code, stderr). Panics when it does not.
fn exit_within(mut child: Child) -> (Option<i32>, String) {
    let until = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the process did not exit within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

/// Blocking GET: (status, JSON body or `Null`).
fn get_status(url: &str) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("GET");
        let st = r.status().as_u16();
        (st, r.json::<Value>().await.unwrap_or(Value::Null))
    })
}

/// Signs and posts the `pull_request` fixture `file` with `trigger-bridge send`, as delivery `id`:
/// (HTTP status, response body).
fn send_pr(base: &str, file: &str, id: &str) -> (u16, Value) {
    let out = Command::new(BIN)
        .args([
            "send",
            "--url",
            &format!("{base}/v1/trigger-subscriptions/github/ingest"),
            "--connector",
            "github",
            "--secret",
            GH_SECRET,
            "--event",
            "pull_request",
            "--delivery-id",
            id,
            "--json",
            "--file",
        ])
        .arg(fixtures().join("github/pull_request").join(file))
        .output()
        .expect("run send");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "send printed no JSON: {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v["status"].as_u64().unwrap() as u16, v["response"].clone())
}

/// A config with the GitHub subscription bound (`pull_request.opened`) to workflow `wf`, given as TOML.
fn config(dir: &Path, server: &str, workflow: &str) -> PathBuf {
    let p = dir.join("pg.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[server]
{server}

[[subscriptions]]
id = "github"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"

[[workflows]]
id = "wf"
{workflow}

[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "wf"
"#
        ),
    )
    .unwrap();
    p
}

/// Runs one SQL query returning one `BIGINT` / `count(*)` on the test schema, off any runtime.
fn count(db: &TestDatabase, sql: &str) -> i64 {
    let cfg = db.config();
    let sql = sql.to_string();
    std::thread::spawn(move || {
        let mut c = tb_store::postgres::connect(&cfg).expect("connect to the test schema");
        c.query_one(sql.as_str(), &[])
            .expect("query")
            .get::<_, i64>(0)
    })
    .join()
    .unwrap()
}

/// Runs one SQL query returning one nullable text column per row, off any runtime.
fn texts(db: &TestDatabase, sql: &str) -> Vec<Option<String>> {
    let cfg = db.config();
    let sql = sql.to_string();
    std::thread::spawn(move || {
        let mut c = tb_store::postgres::connect(&cfg).expect("connect to the test schema");
        c.query(sql.as_str(), &[])
            .expect("query")
            .iter()
            .map(|r| r.get::<_, Option<String>>(0))
            .collect()
    })
    .join()
    .unwrap()
}

#[test]
fn serve_on_postgres_ingests_a_signed_webhook_delivers_it_and_reports_the_pool_in_ready() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "database_pool_size = 3", "executor = \"noop\"");
    let s = Replica::start(dir.path(), &cfg, db.url(), &["--replica-id", "pg-all-1"]);

    let (st, body) = send_pr(&s.base, "00-opened.json", "pg-e2e-1");
    assert_eq!(st, 202, "{body}");
    assert_eq!(body["outcome"], "accepted", "{body}");
    let run_id = body["runId"].as_str().unwrap().to_string();
    let runs = s.wait_for("/v1/runs", |v| {
        v["runs"].as_array().is_some_and(|r| {
            r.len() == 1 && r[0]["status"] == "completed" && r[0]["runId"] == run_id.as_str()
        })
    });
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
    // The same delivery id again: a duplicate, no second delivery.
    let (st, dup) = send_pr(&s.base, "00-opened.json", "pg-e2e-1");
    assert_eq!(st, 200, "{dup}");

    // Everything is in PostgreSQL, in this test's schema.
    assert_eq!(count(&db, "SELECT count(*) FROM receipts"), 1);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM deliveries WHERE state = 'delivered'"
        ),
        1
    );
    assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM runs"), 1);

    let (st, ready) = s.get("/ready");
    assert_eq!(st, 200, "{ready}");
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["checks"]["writer"], "ok");
    assert_eq!(ready["store"]["backend"], "postgresql");
    assert_eq!(ready["store"]["reachable"], true);
    assert_eq!(ready["store"]["connections"], 3, "{ready}");

    // No data-dir lock with PostgreSQL; the secrets still live there.
    assert!(!dir.path().join("data/lock").exists());
    assert!(dir.path().join("data/secrets/host.key").is_file());
    let log = s.log_text();
    assert!(log.contains("replica{replica=pg-all-1}"), "{log}");
    assert!(log.contains("store open"), "{log}");
    assert!(log.contains("postgresql postgres://"), "{log}");
}

#[test]
fn an_api_replica_leaves_deliveries_pending_and_a_worker_replica_on_the_same_database_delivers_them(
) {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "", "executor = \"noop\"");
    let api = Replica::start(
        dir.path(),
        &cfg,
        db.url(),
        &["--role", "api", "--replica-id", "api-1"],
    );
    let mut runs = Vec::new();
    for i in 0..3 {
        let f = "00-opened.json";
        let (st, body) = send_pr(&api.base, f, &format!("roles-{i}"));
        assert_eq!(st, 202, "{f}: {body}");
        assert_eq!(body["outcome"], "accepted", "{f}: {body}");
        runs.push(body["runId"].as_str().unwrap().to_string());
    }
    // The api replica runs no worker: the deliveries stay pending, untouched.
    let (_, d) = api.get("/v1/deliveries");
    let states: Vec<&str> = d["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["pending"; 3], "{d}");
    assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 0);

    // Under RUST_LOG=warn too, the warnings carry the replica.
    let worker = Replica::start_logging(
        dir.path(),
        &cfg,
        db.url(),
        &["--role", "worker", "--replica-id", "worker-1"],
        "warn",
    );
    // The worker's HTTP face is operations only.
    assert_eq!(worker.get("/health").0, 200);
    let (st, ready) = worker.get("/ready");
    assert_eq!(st, 200, "{ready}");
    assert_eq!(ready["store"]["backend"], "postgresql");
    assert_eq!(ready["store"]["connections"], 8, "default pool size");
    let (st, nf) = worker.get("/v1/receipts");
    assert_eq!(st, 404, "{nf}");
    assert_eq!(nf["error"], "not_found");
    let (st, _) = get_status(&format!(
        "{}/v1/trigger-subscriptions/github/ingest",
        worker.base
    ));
    assert_eq!(st, 404);

    let done = api.wait_for("/v1/deliveries", |v| {
        v["deliveries"]
            .as_array()
            .is_some_and(|d| d.len() == 3 && d.iter().all(|d| d["state"] == "delivered"))
    });
    assert_eq!(done["deliveries"].as_array().unwrap().len(), 3);
    let completed = api.wait_for("/v1/runs", |v| {
        v["runs"]
            .as_array()
            .is_some_and(|r| r.iter().filter(|r| r["status"] == "completed").count() == 3)
    });
    let mut got: Vec<String> = completed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_string())
        .collect();
    got.sort();
    runs.sort();
    assert_eq!(
        got, runs,
        "the runs ingest answered with are the ones delivered"
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM attempts"),
        3,
        "one attempt each"
    );
    let wlog = worker.log_text();
    assert!(
        wlog.lines()
            .any(|l| l.contains("WARN replica{replica=worker-1}:") && l.contains("no API keys")),
        "{wlog}"
    );
    assert!(api.log_text().contains("replica{replica=api-1}"));
}

#[test]
fn the_worker_leases_deliveries_as_its_replica_id() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    // A downstream worker that accepts the connection and never answers: the attempt stays in flight.
    let hold = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hold.local_addr().unwrap().port();
    let (tx, held) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut conn, _) = hold.accept().unwrap();
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).unwrap();
        // Kept open (not answered) until the test ends.
        let _ = tx.send((conn, String::from_utf8_lossy(&buf[..n]).to_string()));
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "lease_ms = 30000",
        &format!(
            "executor = \"http\"\nurl = \"http://127.0.0.1:{port}/run\"\nallow_private = true\nsecret = \"env:STANDARD_WEBHOOK_SECRET\"\ntimeout_ms = 20000"
        ),
    );
    let s = Replica::start(dir.path(), &cfg, db.url(), &["--replica-id", "lease-7"]);
    let (st, body) = send_pr(&s.base, "00-opened.json", "lease-1");
    assert_eq!(st, 202, "{body}");
    let (_conn, request) = held
        .recv_timeout(WAIT)
        .expect("the worker's attempt reached the downstream");
    assert!(request.starts_with("POST /run"), "{request}");
    let d = s.wait_for("/v1/deliveries", |v| {
        v["deliveries"][0]["state"] == "in-flight"
    });
    assert_eq!(d["deliveries"][0]["leaseOwner"], "lease-7", "{d}");
    assert_eq!(
        texts(&db, "SELECT lease_owner FROM deliveries"),
        [Some("lease-7".to_string())]
    );
    let log = s.log_text();
    assert!(log.contains("replica{replica=lease-7}"), "{log}");
}

#[test]
fn serve_refuses_an_unreachable_database_naming_it_with_the_password_masked() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "", "executor = \"noop\"");
    let closed = free_port();
    let url = format!("postgres://tb:s3cret-pw@127.0.0.1:{closed}/nope");
    let child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("TRIGGER_BRIDGE_DATABASE_URL", &url)
        .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, err) = exit_within(child);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "opening the PostgreSQL store at postgres://tb:***@127.0.0.1:{closed}/nope"
        )),
        "{err}"
    );
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(!err.contains("s3cret-pw"), "{err}");
}

#[test]
fn check_config_rejects_a_bad_pool_size_and_a_non_postgres_url_without_printing_the_password() {
    let dir = tempfile::tempdir().unwrap();
    for (server, want) in [
        (
            "database_pool_size = 0",
            "[server].database_pool_size 0 is out of range; use 1 to 256 connections (default 8)",
        ),
        (
            "database_pool_size = 300",
            "[server].database_pool_size 300 is out of range",
        ),
        (
            "database_url = \"mysql://tb:s3cret-pw@db/x\"",
            "[server].database_url mysql://tb:***@db/x must start with postgres://",
        ),
    ] {
        let cfg = config(dir.path(), server, "executor = \"noop\"");
        let out = Command::new(BIN)
            .args(["check-config", "--config"])
            .arg(&cfg)
            .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{server}: {err}");
        assert!(err.contains(want), "{server}: {err}");
        assert!(!err.contains("s3cret-pw"), "{err}");
    }
    let cfg = config(
        dir.path(),
        "database_url = \"postgres://tb:pw@db:5432/x\"\ndatabase_pool_size = 16",
        "executor = \"noop\"",
    );
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&cfg)
        .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn migrate_with_a_database_url_prints_the_versions_from_and_to() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let run = || {
        let out = Command::new(BIN)
            .args(["migrate", "--database-url", db.url()])
            .env_remove("TRIGGER_BRIDGE_DATA_DIR")
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let latest = tb_store::postgres::MIGRATIONS.last().unwrap().0;
    let first = run();
    assert!(
        first.ends_with(&format!(": schema version 0 -> {latest}")),
        "{first}"
    );
    assert!(first.starts_with("PostgreSQL store postgres://"), "{first}");
    let second = run();
    assert!(
        second.ends_with(&format!(": already at schema version {latest}")),
        "{second}"
    );
    assert_eq!(
        count(&db, "SELECT max(version) FROM schema_migrations"),
        latest
    );
}

#[test]
fn a_replica_id_with_a_space_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "", "executor = \"noop\"");
    let child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--replica-id", "a b"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, err) = exit_within(child);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--replica-id \"a b\" has ' '"), "{err}");
}

/// A login role of its own for one test, made and dropped (with what it owns) by the test's server user.
struct TestRole {
    name: String,
    admin: TestDbAdmin,
}

/// The URL of the test server's own user (the one the harness connects as).
struct TestDbAdmin(String);

impl TestRole {
    fn create(db: &TestDatabase) -> TestRole {
        let name = format!("{}_role", db.schema());
        let admin = TestDbAdmin(db.url().to_string());
        admin.run(&format!(
            "CREATE ROLE {name} LOGIN; GRANT ALL ON SCHEMA {s} TO {name}",
            s = db.schema()
        ));
        TestRole { name, admin }
    }

    /// `db`'s URL with this role as the user.
    fn url(&self, db: &TestDatabase) -> String {
        let (scheme, rest) = db.url().split_once("://").unwrap();
        let (_, host) = rest.split_once('@').unwrap();
        format!("{scheme}://{}@{host}", self.name)
    }

    /// Forbids (or allows again) this role's logins and, when forbidding, ends its open sessions: its
    /// pool's connections break and cannot come back.
    fn set_login(&self, allowed: bool) {
        let n = &self.name;
        if allowed {
            self.admin.run(&format!("ALTER ROLE {n} LOGIN"));
        } else {
            // Committed first: a pool thread that reconnects after the kill must already be refused.
            self.admin.run(&format!("ALTER ROLE {n} NOLOGIN"));
            // Repeated until none is left: a session that was authenticating during the ALTER
            // may appear just after the first pass.
            let until = Instant::now() + WAIT;
            while self.admin.count(&format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '{n}'"
            )) > 0
            {
                assert!(Instant::now() < until, "sessions of {n} keep coming back");
                std::thread::sleep(Duration::from_millis(25));
            }
        }
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let n = &self.name;
        self.admin.run(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{n}'; DROP OWNED BY {n} CASCADE; DROP ROLE IF EXISTS {n}"
        ));
    }
}

impl TestDbAdmin {
    fn count(&self, sql: &str) -> i64 {
        let (url, sql) = (self.0.clone(), sql.to_string());
        std::thread::spawn(move || {
            let cfg = tb_store::postgres::parse_url(&url).unwrap();
            tb_store::postgres::connect(&cfg)
                .expect("connect as the test server's user")
                .query_one(sql.as_str(), &[])
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get::<_, i64>(0)
        })
        .join()
        .unwrap()
    }

    fn run(&self, sql: &str) {
        let (url, sql) = (self.0.clone(), sql.to_string());
        std::thread::spawn(move || {
            let cfg = tb_store::postgres::parse_url(&url).unwrap();
            tb_store::postgres::connect(&cfg)
                .expect("connect as the test server's user")
                .batch_execute(&sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        })
        .join()
        .unwrap();
    }
}

#[test]
fn ready_is_503_while_the_database_refuses_this_replica_and_200_once_it_takes_it_back() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let role = TestRole::create(&db);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "database_pool_size = 2", "executor = \"noop\"");
    let s = Replica::start(
        dir.path(),
        &cfg,
        &role.url(&db),
        &["--replica-id", "ready-1"],
    );
    let (st, ready) = s.get("/ready");
    assert_eq!(st, 200, "{ready}");
    assert_eq!(ready["store"]["reachable"], true);

    role.set_login(false);
    let down = s.wait_for("/ready", |v| v["status"] == "unavailable");
    assert_eq!(down["store"]["backend"], "postgresql");
    assert_eq!(down["store"]["reachable"], false, "{down}");
    assert!(
        down["checks"]["writer"]
            .as_str()
            .unwrap()
            .contains("cannot connect to PostgreSQL"),
        "{down}"
    );
    assert_eq!(s.get("/ready").0, 503);
    assert_eq!(s.get("/health").0, 200, "liveness does not touch the store");

    role.set_login(true);
    let up = s.wait_for("/ready", |v| v["status"] == "ready");
    assert_eq!(up["store"]["reachable"], true, "{up}");
    assert_eq!(up["store"]["connections"], 2, "{up}");
}
