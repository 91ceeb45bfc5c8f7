//! Three replicas on one PostgreSQL database (DESIGN §5): 5 000 signed webhooks spread over
//! all three, duplicates sent to a different replica than the first copy, one replica SIGKILLed mid-run
//! and restarted. After the drain the database must hold one receipt per dedup key, one run per
//! (receipt, binding), every delivery terminal with gapless attempt numbers, the killed replica's leased
//! work finished by the others soon after its lease lapsed, and every id answered 2xx present.
//!
//! Runs wherever PostgreSQL is reachable (always in CI); skips with a printed reason otherwise.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, BIN, SW_SECRET};
use serde_json::Value;
use tb_store::postgres::testing::TestDatabase;

const EVENTS: usize = 5_000;
const SENDERS: usize = 12;
const LEASE_MS: i64 = 2_000;

/// A replica process: its id, port and child.
struct Replica {
    id: String,
    port: u16,
    data: PathBuf,
    child: Child,
}

/// A replica that did not stop is killed when the test ends, even when it fails.
impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(config: &Path, url: &str, id: &str, port: u16, data: &Path) -> Child {
    Command::new(BIN)
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--database-url", url, "--replica-id", id, "--data-dir"])
        .arg(data)
        .env("STANDARD_WEBHOOK_SECRET", SW_SECRET)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn replica")
}

/// Waits (at most 30 s) until the replica answers `/health`.
async fn healthy(http: &reqwest::Client, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{port}/health"))
            .timeout(Duration::from_secs(1))
            .send()
            .await
        {
            if r.status().is_success() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "replica on {port} did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A blocking query on the test schema, off the async runtime (the driver is synchronous).
fn query<T: Send + 'static>(
    url: &str,
    f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
) -> T {
    let url = url.to_string();
    std::thread::spawn(move || {
        let cfg = tb_store::postgres::parse_url(&url).unwrap();
        let mut c = tb_store::postgres::connect(&cfg).unwrap();
        f(&mut c)
    })
    .join()
    .unwrap()
}

fn count(url: &str, sql: &'static str) -> i64 {
    query(url, move |c| {
        c.query_one(sql, &[]).unwrap().get::<_, i64>(0)
    })
}

/// Posts webhook `id` to the replica at `ports[first]`, moving on to the next replica on a connection
/// error or a 5xx (as a load balancer does), until one answers 200/202. Returns (status, receiptId).
async fn send(
    http: &reqwest::Client,
    ports: &[u16],
    first: usize,
    key: &[u8],
    id: &str,
    body: &[u8],
) -> (u16, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut k = first;
    loop {
        assert!(Instant::now() < deadline, "{id} was never answered");
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let sig = tb_ingress::standard_webhooks::sign(key, id, ts, body);
        let r = http
            .post(format!(
                "http://127.0.0.1:{}/v1/trigger-subscriptions/standard/ingest",
                ports[k % ports.len()]
            ))
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(body.to_vec())
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(r) = r {
            let status = r.status().as_u16();
            if let (200 | 202, Ok(v)) = (status, r.json::<Value>().await) {
                return (status, v["receiptId"].as_str().unwrap().to_string());
            }
            assert!(status >= 500, "unexpected answer {status} for {id}");
        }
        k += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The workflow's receiver: answers 200 after 20 ms, so attempts are in flight when a replica dies.
async fn sink() -> (u16, Arc<Mutex<HashMap<String, u32>>>) {
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move |body: axum::Json<Value>| {
            let s = s.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let run = body["runId"].as_str().unwrap_or_default().to_string();
                *s.lock().unwrap().entry(run).or_default() += 1;
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_killed_keep_every_promise() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let url = db.url().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (sink_port, seen) = sink().await;
    let config = dir.path().join("replicas.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
lease_ms = {LEASE_MS}
# Six replicas of two tests may run at once: keep within PostgreSQL's 100 connections.
database_pool_size = 4
[[subscriptions]]
id = "standard"
connector = "standard-webhooks"
secret = "env:STANDARD_WEBHOOK_SECRET"
[[workflows]]
id = "receiver"
executor = "http"
url = "http://127.0.0.1:{sink_port}/run"
allow_private = true
secret = "env:STANDARD_WEBHOOK_SECRET"
timeout_ms = 1000
[[bindings]]
id = "all"
subscription = "standard"
event_types = ["*"]
action = "start_run"
workflow = "receiver"
"#
        ),
    )
    .unwrap();
    let http = reqwest::Client::new();
    let mut replicas: Vec<Replica> = (1..=3)
        .map(|n| {
            let id = format!("r{n}");
            let port = free_port();
            let data = dir.path().join(&id);
            let child = spawn(&config, &url, &id, port, &data);
            Replica {
                id,
                port,
                data,
                child,
            }
        })
        .collect();
    for r in &replicas {
        healthy(&http, r.port).await;
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();

    let key = tb_ingress::parse_whsec(SW_SECRET).unwrap();
    let answered: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (http, ports, key, answered, next) = (
            http.clone(),
            ports.clone(),
            key.clone(),
            answered.clone(),
            next.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut duplicates = 0;
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= EVENTS {
                    return duplicates;
                }
                let id = format!("msg_replicas_{n:05}");
                let body = format!(r#"{{"type":"replica.test","data":{{"n":{n}}}}}"#);
                let (_, receipt) = send(&http, &ports, n, &key, &id, body.as_bytes()).await;
                answered.lock().unwrap().insert(id.clone(), receipt.clone());
                // Every tenth id again, to ANOTHER replica: the answer is the first receipt.
                if n % 10 == 0 {
                    let (status, again) =
                        send(&http, &ports, n + 1, &key, &id, body.as_bytes()).await;
                    assert_eq!(
                        (status, again),
                        (200, receipt),
                        "a duplicate sent to another replica is answered with the first receipt"
                    );
                    duplicates += 1;
                }
            }
        }));
    }

    // SIGKILL replica 2 once a third of the events were answered, note what it held leased, restart it.
    let deadline = Instant::now() + Duration::from_secs(120);
    while answered.lock().unwrap().len() < EVENTS / 3 {
        assert!(Instant::now() < deadline, "the load did not progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = &mut replicas[1];
    victim.child.kill().unwrap(); // SIGKILL
    victim.child.wait().unwrap();
    let killed_at = Instant::now();
    let held: Vec<(String, i64)> = query(&url, |c| {
        c.query(
            "SELECT id, lease_until FROM deliveries WHERE lease_owner LIKE '%r2%' \
             AND state IN ('pending','retrying') AND lease_until IS NOT NULL",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
    });
    eprintln!(
        "killed r2 at {:.1}s with {} ids answered; it held {} leased deliveries",
        started.elapsed().as_secs_f64(),
        answered.lock().unwrap().len(),
        held.len()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    victim.child = spawn(&config, &url, &victim.id, victim.port, &victim.data);

    let mut duplicates = 0;
    for s in senders {
        duplicates += s.await.unwrap();
    }
    // Drain (bounded): every delivery terminal.
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(
        &url,
        "SELECT COUNT(*) FROM deliveries WHERE state IN ('pending','retrying')",
    ) > 0
    {
        assert!(Instant::now() < deadline, "the backlog did not drain");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();

    let answered = answered.lock().unwrap().clone();
    assert_eq!(answered.len(), EVENTS, "every id was answered 2xx");
    let receipts = count(&url, "SELECT COUNT(*) FROM receipts");
    assert_eq!(receipts as usize, EVENTS, "one receipt per dedup key");
    // Every 2xx answer names the one receipt that holds its key.
    let by_key: HashMap<String, Vec<String>> = query(&url, |c| {
        let mut m: HashMap<String, Vec<String>> = HashMap::new();
        for r in c
            .query(
                "SELECT dedup_key, id FROM receipts WHERE subscription_id = 'standard'",
                &[],
            )
            .unwrap()
        {
            m.entry(r.get(0)).or_default().push(r.get(1));
        }
        m
    });
    for (id, receipt) in &answered {
        let key = tb_core::dedup::dedup_key("standard", id);
        assert_eq!(
            by_key.get(&key),
            Some(&vec![receipt.clone()]),
            "exactly the answered receipt for {id}"
        );
    }
    let pairs_twice = count(
        &url,
        "SELECT COUNT(*) FROM (SELECT receipt_id, binding_id FROM deliveries \
         GROUP BY receipt_id, binding_id HAVING COUNT(*) > 1) x",
    );
    assert_eq!(pairs_twice, 0, "one delivery per (receipt, binding)");
    let runs = count(&url, "SELECT COUNT(*) FROM runs");
    assert_eq!(runs, receipts, "one run per (receipt, binding)");
    let not_terminal = count(
        &url,
        "SELECT COUNT(*) FROM deliveries WHERE state NOT IN ('delivered','dead-lettered')",
    );
    assert_eq!(not_terminal, 0, "every delivery terminal");
    let delivered = count(
        &url,
        "SELECT COUNT(*) FROM deliveries WHERE state = 'delivered'",
    );
    assert_eq!(delivered, receipts, "every delivery delivered");
    let gaps = count(
        &url,
        "SELECT COUNT(*) FROM deliveries d WHERE d.attempts <> \
         (SELECT COUNT(*) FROM attempts a WHERE a.delivery_id = d.id) \
         OR d.attempts <> (SELECT MAX(a.attempt) FROM attempts a WHERE a.delivery_id = d.id)",
    );
    assert_eq!(gaps, 0, "attempt numbers are 1..n, unique per delivery");
    // The killed replica's leased work: finished by the others, its next attempt starting within a
    // lease (plus the workers' poll) of the lease's end.
    let mut late = Vec::new();
    for (delivery, until) in &held {
        let (state, started_at): (String, i64) = {
            let d = delivery.clone();
            query(&url, move |c| {
                let r = c
                    .query_one(
                        "SELECT d.state, MAX(a.started_at) FROM deliveries d JOIN attempts a \
                         ON a.delivery_id = d.id WHERE d.id = $1 GROUP BY d.state",
                        &[&d],
                    )
                    .unwrap();
                (r.get(0), r.get(1))
            })
        };
        assert_eq!(state, "delivered", "{delivery} held by the killed replica");
        if started_at > until + LEASE_MS {
            late.push((delivery.clone(), started_at - until));
        }
    }
    assert!(
        late.is_empty(),
        "leased work of the killed replica picked up late (ms after lease end): {late:?}"
    );
    let runs_seen = seen.lock().unwrap().len();
    assert_eq!(
        runs_seen as i64, runs,
        "the receiver saw every run at least once"
    );
    let redelivered = seen.lock().unwrap().values().filter(|n| **n > 1).count();
    eprintln!(
        "3 replicas: {EVENTS} ids answered, {duplicates} duplicates to another replica, r2 SIGKILLed {:.1}s in \
         holding {} leases; drained in {elapsed:.1}s; store: {receipts} receipts, {runs} runs, {delivered} delivered; \
         receiver: {runs_seen} runs, {redelivered} seen twice (attempts cut by the kill)",
        killed_at.duration_since(started).as_secs_f64(),
        held.len()
    );
    drop(replicas);
}

const GH_SECRET: &str = "replicas-github-secret";

/// Posts a signed GitHub `pull_request` event to replica `port`; returns the HTTP status.
async fn github(http: &reqwest::Client, port: u16, delivery: &str, action: &str, pr: u32) -> u16 {
    let body = serde_json::json!({
        "action": action,
        "repository": {"full_name": "acme/widgets"},
        "pull_request": {"number": pr, "head": {"sha": format!("sha-{delivery}")}, "merged": false}
    })
    .to_string();
    let sig = tb_ingress::github::sign(GH_SECRET.as_bytes(), body.as_bytes());
    http.post(format!(
        "http://127.0.0.1:{port}/v1/trigger-subscriptions/github-sessions/ingest"
    ))
    .header("content-type", "application/json")
    .header("x-github-event", "pull_request")
    .header("x-github-delivery", delivery)
    .header("x-hub-signature-256", sig)
    .body(body)
    .timeout(Duration::from_secs(10))
    .send()
    .await
    .map(|r| r.status().as_u16())
    .unwrap_or(0)
}

async fn api(
    http: &reqwest::Client,
    port: u16,
    method: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{port}{path}");
    let req = match method {
        "POST" => http.post(url).json(&body),
        _ => http.get(url),
    };
    let r = req.timeout(Duration::from_secs(10)).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Sessions over three replicas: concurrent first events for one coalesce key give one session;
/// signals raised one after another through different replicas keep their order; a wait raced by a
/// signal through one replica and its timer on another resolves once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_over_three_replicas_coalesce_keep_order_and_resolve_once() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let url = db.url().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sessions.toml");
    std::fs::write(
        &config,
        r#"
[server]
database_pool_size = 4
[[subscriptions]]
id = "github-sessions"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"
[[workflows]]
id = "pr-session"
executor = "session"
mailbox_bound = 256
[[bindings]]
id = "pr-session-start"
subscription = "github-sessions"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "pr-session"
coalesce_key = "{repository.full_name}#{pull_request.number}"
on_existing = "signal"
signal = "pr.{action}"
"#,
    )
    .unwrap();
    let http = reqwest::Client::new();
    let mut replicas = Vec::new();
    for n in 1..=3 {
        let id = format!("s{n}");
        let port = free_port();
        let data = dir.path().join(&id);
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--database-url", &url, "--replica-id", &id, "--data-dir"])
            .arg(&data)
            .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn replica");
        replicas.push(Replica {
            id,
            port,
            data,
            child,
        });
    }
    for r in &replicas {
        healthy(&http, r.port).await;
    }
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();

    // 1. Twelve different "opened" deliveries for PR 7, four through each replica, all at once.
    let barrier = Arc::new(tokio::sync::Barrier::new(12));
    let mut sends = Vec::new();
    for i in 0..12 {
        let (http, barrier, port) = (http.clone(), barrier.clone(), ports[i % 3]);
        sends.push(tokio::spawn(async move {
            barrier.wait().await;
            github(&http, port, &format!("gh-open-{i}"), "opened", 7).await
        }));
    }
    for s in sends {
        assert_eq!(s.await.unwrap(), 202, "every first event is accepted");
    }
    // Bounded wait until every delivery is terminal (the joins wait for the session to exist).
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(
        &url,
        "SELECT COUNT(*) FROM deliveries WHERE state IN ('pending','retrying')",
    ) > 0
    {
        assert!(Instant::now() < deadline, "the first events did not settle");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sessions = count(
        &url,
        "SELECT COUNT(*) FROM runs WHERE workflow_id = 'pr-session'",
    );
    assert_eq!(
        sessions, 1,
        "one session for one coalesce key across three replicas"
    );
    let run: String = query(&url, |c| {
        c.query_one("SELECT id FROM runs WHERE workflow_id = 'pr-session'", &[])
            .unwrap()
            .get(0)
    });
    let joined = count(
        &url,
        "SELECT COUNT(*) FROM signals WHERE name = 'pr.opened'",
    );
    assert_eq!(
        joined, 11,
        "the other eleven events became signals on that session"
    );

    // 2. Thirty signals raised one after another, each through the next replica: FIFO per run.
    for i in 0..30 {
        let (st, r) = api(
            &http,
            ports[i % 3],
            "POST",
            &format!("/v1/runs/{run}/signals"),
            serde_json::json!({"name": "ci.step", "signalId": format!("step-{i:02}"), "data": {"i": i}}),
        )
        .await;
        assert_eq!(st, 202, "{r}");
    }
    let order: Vec<String> = {
        let run = run.clone();
        query(&url, move |c| {
            c.query(
                "SELECT signal_id FROM signals WHERE run_id = $1 AND name = 'ci.step' ORDER BY seq",
                &[&run],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
        })
    };
    let want: Vec<String> = (0..30).map(|i| format!("step-{i:02}")).collect();
    assert_eq!(
        order, want,
        "arrival order across replicas is the raise order"
    );
    let gaps = {
        let run = run.clone();
        query(&url, move |c| {
            let r = c
                .query_one(
                    "SELECT COUNT(*), MIN(seq), MAX(seq) FROM signals WHERE run_id = $1",
                    &[&run],
                )
                .unwrap();
            (r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2))
        })
    };
    assert_eq!(gaps.2 - gaps.1 + 1, gaps.0, "signal seqs are gapless");

    // 3. A wait on replica 1 with a 400 ms timer, raced by "deploy.done" through replicas 2 and 3
    //    just as the timer comes due: it resolves exactly once.
    let (st, w) = api(
        &http,
        ports[0],
        "POST",
        &format!("/v1/runs/{run}/waits"),
        serde_json::json!({"kind": "signal", "names": ["deploy.done"], "timeoutMs": 400, "reason": "deploy"}),
    )
    .await;
    assert_eq!(st, 201, "{w}");
    let wait_id = w["waitId"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(390)).await;
    let mut racers = Vec::new();
    for (k, port) in [ports[1], ports[2]].into_iter().enumerate() {
        let (http, run) = (http.clone(), run.clone());
        racers.push(tokio::spawn(async move {
            api(
                &http,
                port,
                "POST",
                &format!("/v1/runs/{run}/signals"),
                serde_json::json!({"name": "deploy.done", "signalId": format!("deploy-{k}")}),
            )
            .await
            .0
        }));
    }
    for r in racers {
        assert_eq!(r.await.unwrap(), 202);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let view = loop {
        let (_, v) = api(
            &http,
            ports[2],
            "GET",
            &format!("/v1/runs/{run}/waits/{wait_id}"),
            Value::Null,
        )
        .await;
        if v["state"] != "armed" {
            break v;
        }
        assert!(Instant::now() < deadline, "the wait never resolved");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(view["state"], "resolved", "{view}");
    let resolutions = {
        let (run, wait_id) = (run.clone(), wait_id.clone());
        query(&url, move |c| {
            c.query_one(
                "SELECT COUNT(*) FROM run_events WHERE run_id = $1 \
                 AND type IN ('tb.wait.resolved', 'tb.wait.timeout') AND payload LIKE '%' || $2 || '%'",
                &[&run, &wait_id],
            )
            .unwrap()
            .get::<_, i64>(0)
        })
    };
    assert_eq!(resolutions, 1, "the wait resolved exactly once");
    let consumed = {
        let run = run.clone();
        query(&url, move |c| {
            c.query_one(
                "SELECT COUNT(*) FROM signals WHERE run_id = $1 AND name = 'deploy.done' AND state = 'consumed'",
                &[&run],
            )
            .unwrap()
            .get::<_, i64>(0)
        })
    };
    let winner = view["winner"]["kind"].as_str().unwrap_or("?").to_string();
    match winner.as_str() {
        "signal" => assert_eq!(consumed, 1, "one signal won, the other stays buffered"),
        "timer" | "timeout" => assert_eq!(consumed, 0, "the timer won; both signals stay buffered"),
        other => panic!("unexpected winner {other}: {view}"),
    }
    eprintln!(
        "sessions over 3 replicas: 12 concurrent first events -> {sessions} session, {joined} signals; \
         30 signals in order; the raced wait resolved once (winner {winner})"
    );
    drop(replicas);
}
