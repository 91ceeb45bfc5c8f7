//! Request bodies at the edge, in process: a body that stops arriving is 408
//! `request_timeout` (ingest and JSON management endpoints alike) and leaves no receipt; an ingest body
//! that does not fit the buffered-bytes budget is 503 `unavailable` with `Retry-After: 1`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tb_core::connector::ConnectorSpec;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, Engine, SubscriptionConfig};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trigger_bridge_api::body::{BodyRules, IngestGate, Target};

/// The API with a `timeout_ms` body timeout (no rate rule), 2 body slots and a 64 KiB budget; returns
/// its address.
async fn serve(dir: &tempfile::TempDir, timeout_ms: u64) -> (String, Arc<Engine>) {
    let rules = BodyRules {
        timeout: Duration::from_millis(timeout_ms),
        min_rate_bytes_per_s: 0,
        min_rate_grace: Duration::from_millis(timeout_ms),
    };
    let (addr, engine, _) = serve_with(dir, rules, IngestGate::new(2, 64 * 1024)).await;
    (addr, engine)
}

/// The API under `rules` and `gate`, with two GitHub subscriptions (`github`, `github2`, secret `s`,
/// 48 KiB bodies), a session workflow `wf` and a worker; returns its address, engine and gate.
async fn serve_with(
    dir: &tempfile::TempDir,
    rules: BodyRules,
    gate: IngestGate,
) -> (String, Arc<Engine>, Arc<IngestGate>) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let sub = |id: &str| SubscriptionConfig {
        max_body_bytes: 48 * 1024,
        ..SubscriptionConfig::webhook(id, ConnectorSpec::Github, b"s")
    };
    let wf = Workflow {
        id: "wf".into(),
        executor: Executor::Session {
            config: serde_json::json!({}),
            mailbox: Default::default(),
        },
    };
    let engine = Engine::start(
        store,
        Catalog::new(vec![sub("github"), sub("github2")], vec![], vec![wf]),
    )
    .await
    .unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    tokio::spawn(tb_engine::worker::run(
        engine.clone(),
        Default::default(),
        rx,
    ));
    let app = trigger_bridge_api::router(trigger_bridge_api::AppState {
        engine: engine.clone(),
        metrics: None,
        host: Default::default(),
        keys: trigger_bridge_api::auth::ApiKeys(Arc::new(vec![])),
        secrets: None,
    });
    let gate = Arc::new(gate);
    let app = trigger_bridge_api::body::layer(app, rules, gate.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, engine, gate)
}

/// A GitHub ping signed with the subscriptions' secret, to `subscription`; its status.
async fn signed_ping(
    http: &reqwest::Client,
    addr: &str,
    subscription: &str,
    delivery: &str,
) -> u16 {
    let body = br#"{"zen":"Keep it logically awesome."}"#.to_vec();
    let sig = tb_ingress::github::sign(b"s", &body);
    http.post(format!(
        "http://{addr}/v1/trigger-subscriptions/{subscription}/ingest"
    ))
    .header("content-type", "application/json")
    .header("x-github-event", "ping")
    .header("x-github-delivery", delivery)
    .header("x-hub-signature-256", sig)
    .body(body)
    .timeout(Duration::from_secs(3))
    .send()
    .await
    .unwrap()
    .status()
    .as_u16()
}

/// The head of a stalled GitHub ingest to `subscription` declaring 1 000 bytes.
fn stalled_ingest_head(subscription: &str) -> String {
    format!("POST /v1/trigger-subscriptions/{subscription}/ingest HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-github-event: ping\r\ncontent-length: 1000\r\n\r\n")
}

/// Polls `cond` every 10 ms for at most 2 s; panics with `what` when it never held.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(2), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Opens a connection, sends `head` and `part` of the body, then nothing; returns the stream.
async fn open_stalled(addr: &str, head: &str, part: &[u8]) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(part).await.unwrap();
    s
}

/// Reads one answer from `s` (until close, or until its headers and `content-length` body are in),
/// for at most 3 s.
async fn answer(s: &mut tokio::net::TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            let t = String::from_utf8_lossy(&got).to_ascii_lowercase();
            if let Some((head, body)) = t.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if len.is_some_and(|n| body.len() >= n) {
                    break;
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).to_string()
}

/// Sends `head` and `body_part` and then nothing; returns the raw answer (read until close, 3 s max)
/// and the stream (kept open by the caller).
async fn stalled(addr: &str, head: &str, body_part: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body_part).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).to_string()
}

fn envelope(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_stalled_ingest_body_is_408_and_leaves_no_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, engine) = serve(&dir, 300).await;
    let t0 = std::time::Instant::now();
    let a = stalled(
        &addr,
        "POST /v1/trigger-subscriptions/github/ingest HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-github-event: ping\r\nx-github-delivery: d1\r\ncontent-length: 1000\r\n\r\n",
        b"{\"zen\":",
    )
    .await;
    assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let e = envelope(&a);
    assert_eq!(e["error"], "request_timeout", "{a}");
    let receipts = engine
        .store
        .list_receipts(Default::default())
        .await
        .unwrap();
    assert!(receipts.is_empty(), "{receipts:?}");
}

#[tokio::test]
async fn a_stalled_json_body_of_a_management_endpoint_is_408() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _engine) = serve(&dir, 300).await;
    let a = stalled(
        &addr,
        "POST /v1/runs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n",
        b"{\"workflowId\":",
    )
    .await;
    assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    assert_eq!(envelope(&a)["error"], "request_timeout", "{a}");
}

#[tokio::test]
async fn an_ingest_body_over_the_remaining_budget_is_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _engine) = serve(&dir, 1500).await;
    // Holds 40 KiB of the 64 KiB budget while it stalls.
    let holder_addr = addr.clone();
    let holder = tokio::spawn(async move {
        stalled(
            &holder_addr,
            "POST /v1/trigger-subscriptions/github/ingest HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-github-event: ping\r\ncontent-length: 40960\r\n\r\n",
            b"{",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!(
            "http://{addr}/v1/trigger-subscriptions/github/ingest"
        ))
        .header("content-type", "application/json")
        .header("x-github-event", "ping")
        .header("x-github-delivery", "d2")
        .body(vec![b' '; 40 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "unavailable");
    // An unknown capability token is 404 before its body is read: it never meets the budget.
    let r = http
        .post(format!("http://{addr}/v1/hooks/tok_unknown"))
        .header("content-type", "application/json")
        .body(vec![b' '; 30 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // The stalled holder times out (408) and frees its share: the same body is now read and verified.
    assert!(holder.await.unwrap().starts_with("HTTP/1.1 408"));
    let r = http
        .post(format!(
            "http://{addr}/v1/trigger-subscriptions/github/ingest"
        ))
        .header("content-type", "application/json")
        .header("x-github-event", "ping")
        .header("x-github-delivery", "d3")
        .body(vec![b' '; 40 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        401,
        "read, then refused by its (missing) signature"
    );
}

/// `Expect: 100-continue` with a Content-Length over the subscription's
/// `max_body_bytes` is answered 413 at once, without `100 Continue` and without reading the body.
#[tokio::test]
async fn expect_continue_over_the_limit_is_413_without_100_continue() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, engine) = serve(&dir, 10_000).await;
    let t0 = std::time::Instant::now();
    // The headers only: a client that expects 100 waits for it before sending the body.
    let a = stalled(
        &addr,
        "POST /v1/trigger-subscriptions/github/ingest HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-github-event: ping\r\nexpect: 100-continue\r\ncontent-length: 100000\r\n\r\n",
        b"",
    )
    .await;
    assert!(a.starts_with("HTTP/1.1 413"), "{a}");
    assert!(!a.contains("100 Continue"), "{a}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let e = envelope(&a);
    assert_eq!(e["error"], "payload_too_large", "{a}");
    assert_eq!(
        e["message"], "body exceeds this endpoint's limit of 49152 bytes",
        "{a}"
    );
    // Within the limit, 100 Continue is still sent once the body is read, and the request goes on
    // (to its signature check: 401).
    let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
    c.write_all(b"POST /v1/trigger-subscriptions/github/ingest HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-github-event: ping\r\nexpect: 100-continue\r\nconnection: close\r\ncontent-length: 2\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..n], b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(b"{}").await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), c.read_to_end(&mut got)).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
    let receipts = engine
        .store
        .list_receipts(Default::default())
        .await
        .unwrap();
    assert!(receipts.is_empty(), "{receipts:?}");
}

/// A live capability token on a new running session of `wf`.
async fn mint(http: &reqwest::Client, addr: &str, engine: &Engine) -> String {
    let r: Value = http
        .post(format!("http://{addr}/v1/runs"))
        .json(&serde_json::json!({"workflowId": "wf", "inputs": {}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run = r["runId"].as_str().expect("runId").to_string();
    let t0 = std::time::Instant::now();
    loop {
        let v: Value = http
            .get(format!("http://{addr}/v1/runs/{run}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["status"] == "running" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "run never started: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = tb_engine::capability::mint(
        engine,
        None,
        tb_engine::capability::MintRequest {
            run_id: run,
            signal: "go".into(),
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    m.token
}

/// Slow bodies: a made-up capability token is answered 404 at
/// once, before its body is read, so stalled bodies to made-up `/v1/hooks/...` URLs hold no body slot:
/// a signed ingest racing them gets 202. (Before: each buffered under the shared gate first, so the
/// signed ingest got 503 and the hooks waited for the body timeout, 408.)
#[tokio::test]
async fn made_up_capability_tokens_are_404_before_the_body_and_hold_no_slot() {
    let dir = tempfile::tempdir().unwrap();
    let rules = BodyRules {
        timeout: Duration::from_millis(3000),
        min_rate_bytes_per_s: 0,
        min_rate_grace: Duration::from_millis(3000),
    };
    let (addr, _engine, gate) = serve_with(&dir, rules, IngestGate::new(2, 64 * 1024)).await;
    let http = reqwest::Client::new();
    let t0 = std::time::Instant::now();
    let mut hooks = Vec::new();
    for i in 0..4 {
        hooks.push(
            open_stalled(
                &addr,
                &format!("POST /v1/hooks/tbcap_madeup{i} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n"),
                b"{",
            )
            .await,
        );
    }
    // Races the stalled hooks (all four are open, their bodies unfinished).
    assert_eq!(signed_ping(&http, &addr, "github", "race-1").await, 202);
    for mut h in hooks {
        let a = answer(&mut h).await;
        assert!(a.starts_with("HTTP/1.1 404"), "{a}");
        assert_eq!(envelope(&a)["error"], "not_found", "{a}");
    }
    assert!(
        t0.elapsed() < Duration::from_millis(2000),
        "answered before any body timeout: {:?}",
        t0.elapsed()
    );
    assert_eq!(gate.held_by(&Target::Capabilities), 0);
    // The budget comes back when the server drops each connection's body, just after its answer:
    // waited for, within a bound.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while gate.budget_available() != 64 * 1024 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(gate.budget_available(), 64 * 1024);
}

/// A live token still buffers under the capability pool's share of the slots, and is answered by the
/// rest of the documented order (here: 202).
#[tokio::test]
async fn a_live_capability_token_buffers_under_the_capability_pool() {
    let dir = tempfile::tempdir().unwrap();
    let rules = BodyRules {
        timeout: Duration::from_millis(3000),
        min_rate_bytes_per_s: 0,
        min_rate_grace: Duration::from_millis(3000),
    };
    let gate = IngestGate::new(4, 64 * 1024).with_per_target(1);
    let (addr, engine, gate) = serve_with(&dir, rules, gate).await;
    let http = reqwest::Client::new();
    let token = mint(&http, &addr, &engine).await;
    let mut held = open_stalled(
        &addr,
        &format!("POST /v1/hooks/{token} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"),
        b"{",
    )
    .await;
    wait_until("the live token's body holds the pool's slot", || {
        gate.held_by(&Target::Capabilities) == 1
    })
    .await;
    let r = http
        .post(format!("http://{addr}/v1/hooks/{token}"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503, "the pool's one slot is taken");
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(
        signed_ping(&http, &addr, "github", "other-target").await,
        202
    );
    held.write_all(b"}").await.unwrap();
    held.write_all(&[b' '; 98]).await.unwrap();
    let a = answer(&mut held).await;
    assert!(a.starts_with("HTTP/1.1 202"), "{a}");
    assert_eq!(envelope(&a)["accepted"], true, "{a}");
}

/// Fix 2: one subscription's stalled bodies take at most `max_inflight_bodies_per_target` slots; the
/// rest of its bodies get 503 `Retry-After: 1`, and a signed ingest to ANOTHER subscription still gets
/// 202. (Before: the four stalled bodies took all four slots and `github2` got 503.)
#[tokio::test]
async fn stalled_bodies_to_one_subscription_leave_the_others_their_slots() {
    let dir = tempfile::tempdir().unwrap();
    let rules = BodyRules {
        timeout: Duration::from_millis(2500),
        min_rate_bytes_per_s: 0,
        min_rate_grace: Duration::from_millis(2500),
    };
    let gate = IngestGate::new(4, 64 * 1024).with_per_target(2);
    let (addr, _engine, gate) = serve_with(&dir, rules, gate).await;
    let github = Target::Subscription("github".into());
    // The attacker opens as many stalled bodies to `github` as there are slots.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut s = open_stalled(&addr, &stalled_ingest_head("github"), b"{").await;
        stalled.push(tokio::spawn(async move { answer(&mut s).await }));
    }
    wait_until("github holds its share", || gate.held_by(&github) == 2).await;
    let http = reqwest::Client::new();
    assert_eq!(signed_ping(&http, &addr, "github2", "fair-1").await, 202);
    assert_eq!(signed_ping(&http, &addr, "github2", "fair-2").await, 202);
    // A signed ingest to the saturated subscription: 503 for that target only.
    let body = br#"{"zen":"x"}"#.to_vec();
    let r = http
        .post(format!(
            "http://{addr}/v1/trigger-subscriptions/github/ingest"
        ))
        .header("content-type", "application/json")
        .header("x-github-event", "ping")
        .header("x-github-delivery", "fair-3")
        .header("x-hub-signature-256", tb_ingress::github::sign(b"s", &body))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "unavailable");
    assert_eq!(gate.held_by(&github), 2, "still held by the stalled bodies");
    // Of the four stalled bodies, two were refused (503, answered once their drain ends at the body
    // timeout) and two held their slots until the body timeout (408).
    let mut ends = Vec::new();
    for s in stalled {
        let a = s.await.unwrap();
        ends.push(a.get(..12).unwrap_or("").to_string());
    }
    ends.sort();
    assert_eq!(
        ends,
        [
            "HTTP/1.1 408",
            "HTTP/1.1 408",
            "HTTP/1.1 503",
            "HTTP/1.1 503"
        ],
        "{ends:?}"
    );
    assert_eq!(gate.held_by(&github), 0);
}

/// Fix 3: a body trickled under `body_min_rate_bytes_per_s` is 408 shortly after
/// `body_min_rate_grace_ms`, long before `body_timeout_ms` (the gap rule it meets). (Before: the rate
/// applied only after `body_timeout_ms`, here 10 s.)
#[tokio::test]
async fn a_body_trickled_under_the_rate_is_408_shortly_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let rules = BodyRules {
        timeout: Duration::from_millis(10_000),
        min_rate_bytes_per_s: 16 * 1024,
        min_rate_grace: Duration::from_millis(500),
    };
    let (addr, engine, gate) = serve_with(&dir, rules, IngestGate::new(4, 64 * 1024)).await;
    // Declares 40 000 bytes: the trickle below would need 40 s to finish it.
    let head =
        stalled_ingest_head("github").replace("content-length: 1000", "content-length: 40000");
    let mut s = open_stalled(&addr, &head, b"{").await;
    let t0 = std::time::Instant::now();
    // 100 bytes every 100 ms (1 KB/s): within the 10 s gap rule, far under 16 KiB/s.
    let (mut r, mut w) = s.split();
    let trickle = async {
        for _ in 0..30 {
            if w.write_all(&[b' '; 100]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let read = async {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(4), r.read_to_end(&mut got)).await;
        (String::from_utf8_lossy(&got).to_string(), t0.elapsed())
    };
    let ((a, took), ()) = tokio::join!(read, async {
        tokio::select! { _ = trickle => {}, _ = tokio::time::sleep(Duration::from_secs(4)) => {} }
    });
    assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    assert_eq!(envelope(&a)["error"], "request_timeout", "{a}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(1500),
        "408 after {took:?}"
    );
    assert_eq!(gate.held_by(&Target::Subscription("github".into())), 0);
    let receipts = engine
        .store
        .list_receipts(Default::default())
        .await
        .unwrap();
    assert!(receipts.is_empty(), "{receipts:?}");
}
