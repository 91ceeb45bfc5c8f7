//! Workers over NATS across processes: three bridge replicas on one PostgreSQL database
//! and one nats-server, two replicas of the example service (`crates/sdk/examples/pr_triage.rs`).
//! GitHub `pull_request.opened` webhooks spread over the bridges start nats runs; the service
//! registers, gets its flow (register reply, then the later replicas' broadcasts), handles each
//! action and ends each run with its CompletionEvent. Mid-run one service replica and one bridge
//! replica are SIGKILLed: the actions the dead service replica held are redelivered to the other
//! (after its ack_wait), the events the dead bridge held are applied by the others, and every run
//! completes exactly once.
//!
//! Needs PostgreSQL and `/usr/sbin/nats-server` (always there in CI; skips with a printed reason
//! otherwise) and the example binary, which `cargo test --workspace` builds (run
//! `cargo build -p trigger-bridge-sdk --example pr_triage` first when testing this crate alone).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixtures, free_port, BIN, GH_SECRET};
use tb_store::postgres::testing::TestDatabase;

const EVENTS: usize = 40;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The example binary next to this test's target directory.
fn example() -> PathBuf {
    let bin = Path::new(BIN);
    let p = bin.parent().unwrap().join("examples/pr_triage");
    assert!(
        p.is_file(),
        "{} not found: `cargo test --workspace` builds it; alone, run `cargo build -p trigger-bridge-sdk --example pr_triage` first",
        p.display()
    );
    p
}

fn bridge(config: &Path, db: &str, nats: &str, id: &str, port: u16, data: &Path) -> Proc {
    Proc(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--database-url",
                db,
                "--nats-url",
                nats,
                "--replica-id",
                id,
                "--data-dir",
            ])
            .arg(data)
            .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn bridge"),
    )
}

fn service(nats: &str, log: &Path) -> Proc {
    let out = std::fs::File::create(log).unwrap();
    Proc(
        Command::new(example())
            .env("NATS_URL", nats)
            .env("TRIAGE_WORK_MS", "1500")
            .env("NO_COLOR", "1")
            .stdout(out)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the example service"),
    )
}

fn healthy(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::ureq_get(&format!("http://127.0.0.1:{port}/health")).is_none() {
        assert!(Instant::now() < deadline, "bridge on {port} did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn count(url: &str, sql: &str) -> i64 {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || {
        let cfg = tb_store::postgres::parse_url(&url).unwrap();
        let mut c = tb_store::postgres::connect(&cfg).unwrap();
        c.query_one(sql.as_str(), &[]).unwrap().get::<_, i64>(0)
    })
    .join()
    .unwrap()
}

fn send(port: u16, delivery: &str, file: &Path) -> u16 {
    let out = Command::new(BIN)
        .args([
            "send",
            "--url",
            &format!("http://127.0.0.1:{port}/v1/trigger-subscriptions/github/ingest"),
        ])
        .args([
            "--connector",
            "github",
            "--secret",
            GH_SECRET,
            "--event",
            "pull_request",
            "--json",
        ])
        .args(["--delivery-id", delivery, "--file"])
        .arg(file)
        .output()
        .expect("run send");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["status"].as_u64().unwrap_or(0) as u16
}

#[test]
fn three_bridges_and_two_service_replicas_complete_every_run_once_through_kills() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let Some(nats) = tb_engine::testing::NatsServer::start() else {
        return;
    };
    let (db_url, nats_url) = (db.url().to_string(), nats.url());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("services.toml");
    std::fs::write(
        &config,
        r#"
[server]
lease_ms = 3000
database_pool_size = 4
[[subscriptions]]
id = "github"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"
[[workflows]]
id = "triage"
executor = "nats"
service = "pr-bot"
action = "triage"
[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "triage"
inputs = { repository = "repository.full_name", number = "pull_request.number" }
"#,
    )
    .unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut bridges: Vec<Option<Proc>> = Vec::new();
    bridges.push(Some(bridge(
        &config,
        &db_url,
        &nats_url,
        "r1",
        ports[0],
        &dir.path().join("r1"),
    )));
    healthy(ports[0]);
    // Two service replicas register with the first bridge (its reply carries the flow).
    let logs = [dir.path().join("svc-a.log"), dir.path().join("svc-b.log")];
    let mut svc_a = Some(service(&nats_url, &logs[0]));
    let _svc_b = service(&nats_url, &logs[1]);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    wait(
        "both service replicas registered",
        Duration::from_secs(20),
        || {
            logs.iter()
                .all(|l| read(l).contains("registered") && read(l).contains("flows=1"))
        },
    );
    // The later bridges broadcast the flow to every service replica when they start.
    for (i, id) in [(1, "r2"), (2, "r3")] {
        bridges.push(Some(bridge(
            &config,
            &db_url,
            &nats_url,
            id,
            ports[i],
            &dir.path().join(id),
        )));
        healthy(ports[i]);
    }
    wait(
        "the flow broadcast reached both replicas",
        Duration::from_secs(10),
        || {
            logs.iter()
                .all(|l| read(l).contains("flow broadcast received"))
        },
    );
    let svc = common::ureq_get(&format!("http://127.0.0.1:{}/v1/services", ports[2])).unwrap();
    assert_eq!(svc["services"][0]["name"], "pr-bot", "{svc}");
    assert_eq!(svc["services"][0]["liveness"], "up", "{svc}");
    let opened = fixtures().join("github/pull_request/00-opened.json");
    for i in 0..EVENTS {
        let status = send(ports[i % 3], &format!("gh-delivery-{i}"), &opened);
        assert_eq!(status, 202, "webhook {i}");
    }
    // Actions are in flight on both service replicas (1.5 s each): kill one, and one bridge.
    std::thread::sleep(Duration::from_millis(700));
    drop(svc_a.take());
    drop(bridges[1].take());
    wait("every run completed", Duration::from_secs(90), || {
        count(
            &db_url,
            "SELECT COUNT(*) FROM runs WHERE status = 'completed'",
        ) == EVENTS as i64
    });
    assert_eq!(
        count(&db_url, "SELECT COUNT(*) FROM runs"),
        EVENTS as i64,
        "one run per webhook"
    );
    assert_eq!(
        count(
            &db_url,
            "SELECT COUNT(*) FROM deliveries WHERE state <> 'delivered'"
        ),
        0,
        "every delivery delivered"
    );
    // Each run ended once, however often its action or CompletionEvent was delivered.
    assert_eq!(
        count(
            &db_url,
            "SELECT COUNT(*) FROM (SELECT run_id FROM run_events WHERE type = 'run.completed' GROUP BY run_id HAVING COUNT(*) = 1) x"
        ),
        EVENTS as i64
    );
    // The killed replica's actions were redelivered to the survivor.
    let survivor = read(&logs[1]);
    assert!(
        survivor.contains("attempt 2"),
        "no redelivered action on the surviving replica:\n{survivor}"
    );
    // The service stays up (the survivor heartbeats).
    let out = Command::new(BIN)
        .args([
            "services",
            "list",
            "--server",
            &format!("http://127.0.0.1:{}", ports[0]),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("pr-bot") && text.contains("up"), "{text}");
    // The killed replica went silent 15 s ago at least: one of two replicas is live.
    let svc = common::ureq_get(&format!("http://127.0.0.1:{}/v1/services", ports[0])).unwrap();
    let s0 = &svc["services"][0];
    assert_eq!(
        (
            s0["replicasLive"].as_u64(),
            s0["replicas"].as_array().map(Vec::len)
        ),
        (Some(1), Some(2)),
        "{svc}"
    );
    // No action failed for good: the services' dead letters are empty; a bad limit is refused.
    let base = format!("http://127.0.0.1:{}", ports[2]);
    let out = Command::new(BIN)
        .args([
            "services",
            "dead-letters",
            "--service",
            "pr-bot",
            "--server",
            &base,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("no dead letters"),
        "{text}"
    );
    let (status, body) = common::post(
        &format!("{base}/v1/services/dead-letters"),
        &serde_json::json!({}),
    );
    assert_eq!(status, 405, "{body}");
    let bad = common::ureq_get(&format!("{base}/v1/services/dead-letters?limit=0")).unwrap();
    assert_eq!(bad["error"], "validation_error", "{bad}");
}
