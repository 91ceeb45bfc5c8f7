//! Request bodies at the edge (issue #9 defect 1), in process: a body that stops arriving is 408
//! `request_timeout` (ingest and JSON management endpoints alike) and leaves no receipt; an ingest body
//! that does not fit the buffered-bytes budget is 503 `unavailable` with `Retry-After: 1`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tb_core::connector::ConnectorSpec;
use tb_engine::{Catalog, Engine, SubscriptionConfig};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use trigger_bridge_api::body::{BodyRules, IngestGate};

/// The API with a `timeout_ms` body timeout, 2 body slots and a 64 KiB budget; returns its address.
async fn serve(dir: &tempfile::TempDir, timeout_ms: u64) -> (String, Arc<Engine>) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let sub = SubscriptionConfig {
        max_body_bytes: 48 * 1024,
        ..SubscriptionConfig::webhook("github", ConnectorSpec::Github, b"s")
    };
    let engine = Engine::start(store, Catalog::new(vec![sub], vec![], vec![]))
        .await
        .unwrap();
    let app = trigger_bridge_api::router(trigger_bridge_api::AppState {
        engine: engine.clone(),
        metrics: None,
        host: Default::default(),
        keys: trigger_bridge_api::auth::ApiKeys(Arc::new(vec![])),
        secrets: None,
    });
    let app = trigger_bridge_api::body::layer(
        app,
        BodyRules {
            timeout: Duration::from_millis(timeout_ms),
            min_rate_bytes_per_s: 0,
        },
        Arc::new(IngestGate::new(2, 64 * 1024)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, engine)
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
    // Capability hooks buffer under the same budget (30 KiB: under their 32 KiB limit, over the
    // 24 KiB left).
    let r = http
        .post(format!("http://{addr}/v1/hooks/tok_unknown"))
        .header("content-type", "application/json")
        .body(vec![b' '; 30 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
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

/// Issue #9 follow-up: `Expect: 100-continue` with a Content-Length over the subscription's
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
