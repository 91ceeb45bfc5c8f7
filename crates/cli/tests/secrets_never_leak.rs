//! No secret ever reaches a log line or an answer. The real binary runs at `RUST_LOG=debug`
//! with a secret for every kind the server holds: a GitHub secret and the previous one of a rotation,
//! a Standard Webhooks `whsec_`, a generic HMAC secret, the http executor's signing key (its worker
//! fails, so attempts are retried and logged) and an API key. It takes valid, rotated and forged
//! requests of each; then every log line and every answer an operator can read (receipts and their
//! timelines, deliveries and attempts, runs and their events, dead letters, subscriptions, the audit
//! log, activity, metrics) is searched for each secret, as written and in the encodings a slip would
//! use (base64, hex, the decoded `whsec_` key).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use serde_json::Value;

const GH: &str = "leaktest-github-secret-A1B2C3";
const GH_OLD: &str = "leaktest-github-previous-D4E5F6";
const HMAC: &str = "leaktest-hmac-secret-G7H8I9";
const API_KEY: &str = "leaktest-api-key-J0K1L2M3N4O5P6Q7";
const SW_KEY: &[u8] = b"leaktest-standard-webhooks-key!!";
const WORKER_KEY: &[u8] = b"leaktest-worker-signing-key-0001";

fn whsec(key: &[u8]) -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

/// Every spelling of a secret a leak could take.
fn spellings(s: &[u8]) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut v = vec![
        String::from_utf8_lossy(s).into_owned(),
        b64.encode(s),
        hex::encode(s),
    ];
    if let Some(rest) = std::str::from_utf8(s)
        .ok()
        .and_then(|t| t.strip_prefix("whsec_"))
    {
        v.push(rest.to_string());
        if let Ok(k) = b64.decode(rest) {
            v.push(String::from_utf8_lossy(&k).into_owned());
            v.push(hex::encode(&k));
        }
    }
    v
}

fn config(dir: &std::path::Path, worker: u16) -> std::path::PathBuf {
    let until = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let p = dir.join("leak.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[[subscriptions]]
id = "github"
connector = "github"
secret = "env:LEAK_GH"
[subscriptions.rotation]
previous_secret = "env:LEAK_GH_OLD"
until = "{until}"
[subscriptions.retry]
max_attempts = 2
backoff = "fixed"
initial_ms = 100
max_ms = 100
jitter = 0.0

[[subscriptions]]
id = "sw"
connector = "standard-webhooks"
secret = "env:LEAK_SW"

[[subscriptions]]
id = "hmac"
connector = "hmac"
secret = "env:LEAK_HMAC"
[subscriptions.hmac]
signature_header = "x-signature"
signature_prefix = "sha256="
id_header = "x-id"

[[workflows]]
id = "worker"
executor = "http"
url = "http://127.0.0.1:{worker}/run"
allow_private = true
secret = "env:LEAK_WORKER"
timeout_ms = 2000

[[bindings]]
id = "pr"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "worker"
"#
        ),
    )
    .unwrap();
    p
}

async fn post(http: &reqwest::Client, url: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    let mut r = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in headers {
        r = r.header(*k, v);
    }
    r.send().await.unwrap().status().as_u16()
}

async fn read(http: &reqwest::Client, base: &str, path: &str) -> String {
    http.get(format!("{base}{path}"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (port, worker_port) = (free_port(), free_port());
    let sw = whsec(SW_KEY);
    let worker_secret = whsec(WORKER_KEY);
    // The built-in test worker, failing every call (500), so attempts fail and are logged.
    let mut worker = Command::new(BIN)
        .args([
            "test-worker",
            "--listen",
            &format!("127.0.0.1:{worker_port}"),
            "--fail",
        ])
        .args(["--secret", &worker_secret])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = dir.path().join("server.log");
    let mut server = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(config(dir.path(), worker_port))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .env("LEAK_GH", GH)
        .env("LEAK_GH_OLD", GH_OLD)
        .env("LEAK_SW", &sw)
        .env("LEAK_HMAC", HMAC)
        .env("LEAK_WORKER", &worker_secret)
        .env("TRIGGER_BRIDGE_API_KEY", API_KEY)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let start = Instant::now();
    while http.get(format!("{base}/health")).send().await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let opened = std::fs::read(fixtures().join("github/pull_request/00-opened.json")).unwrap();
    let gh = |secret: &str, id: &str| {
        vec![
            ("x-github-event", "pull_request".to_string()),
            ("x-github-delivery", id.to_string()),
            (
                "x-hub-signature-256",
                tb_ingress::github::sign(secret.as_bytes(), &opened),
            ),
        ]
    };
    let ingest = |sub: &str| format!("{base}/v1/trigger-subscriptions/{sub}/ingest");
    assert_eq!(
        post(&http, &ingest("github"), &gh(GH, "leak-1"), &opened).await,
        202
    );
    assert_eq!(
        post(&http, &ingest("github"), &gh(GH_OLD, "leak-2"), &opened).await,
        202,
        "rotated"
    );
    assert_eq!(
        post(&http, &ingest("github"), &gh("forged", "leak-3"), &opened).await,
        401
    );
    let body = br#"{"type":"invoice.paid","data":{"n":1}}"#;
    let ts = chrono::Utc::now().timestamp();
    for (key, id, want) in [
        (SW_KEY, "msg_leaktest_0000000001", 202),
        (
            b"x-wrong-key-wrong-key-wrong-key!" as &[u8],
            "msg_leaktest_0000000002",
            401,
        ),
    ] {
        let sig = tb_ingress::standard_webhooks::sign(key, id, ts, body);
        let h = [
            ("webhook-id", id.to_string()),
            ("webhook-timestamp", ts.to_string()),
            ("webhook-signature", sig),
        ];
        assert_eq!(post(&http, &ingest("sw"), &h, body).await, want);
    }
    let spec = tb_core::connector::ConnectorSpec::Hmac {
        signature_header: "x-signature".into(),
        signature_prefix: Some("sha256=".into()),
        encoding: Default::default(),
        timestamp_header: None,
        tolerance_s: 300,
        id_header: Some("x-id".into()),
        event_header: None,
    };
    for (key, id, want) in [(HMAC, "h-1", 202), ("not-it", "h-2", 401)] {
        let sig = tb_ingress::hmac_generic::sign(&spec, key.as_bytes(), None, body);
        let h = [("x-id", id.to_string()), ("x-signature", sig)];
        assert_eq!(post(&http, &ingest("hmac"), &h, body).await, want);
    }
    // A registered subscription and a rotation of its secret: each secret is in its one-time answer
    // and nowhere else; both verify while the rotation's overlap lasts.
    let call = |path: String, body: Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(API_KEY)
            .json(&body)
            .send()
    };
    let reg: Value = call(
        "/v1/trigger-subscriptions".into(),
        serde_json::json!({"source": "webhook", "workflowId": "worker"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let rid = reg["subscription"]["subscriptionId"]
        .as_str()
        .unwrap()
        .to_string();
    let registered = reg["binding"]["signingSecret"]
        .as_str()
        .unwrap()
        .to_string();
    let rot: Value = call(
        format!("/v1/trigger-subscriptions/{rid}/rotate-secret"),
        serde_json::json!({"overlapSeconds": 600}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let rotated = rot["signingSecret"].as_str().unwrap().to_string();
    for (secret, id) in [
        (&registered, "msg_leaktest_0000000011"),
        (&rotated, "msg_leaktest_0000000012"),
    ] {
        let key = tb_ingress::parse_whsec(secret).unwrap();
        let h = [
            ("webhook-id", id.to_string()),
            ("webhook-timestamp", ts.to_string()),
            (
                "webhook-signature",
                tb_ingress::standard_webhooks::sign(&key, id, ts, body),
            ),
        ];
        assert_eq!(post(&http, &ingest(&rid), &h, body).await, 202);
    }
    // Wait for both runs' deliveries to use up their 2 attempts against the failing worker.
    let start = Instant::now();
    loop {
        let v: Value =
            serde_json::from_str(&read(&http, &base, "/v1/deliveries?state=dead-lettered").await)
                .unwrap();
        if v["deliveries"].as_array().is_some_and(|d| d.len() >= 2) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "attempts never ran out: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Everything an operator can read.
    let mut seen = Vec::new();
    for path in [
        "/v1/receipts?limit=500",
        "/v1/deliveries?limit=500",
        "/v1/runs?limit=500",
        "/v1/trigger-subscriptions",
        "/v1/trigger-subscriptions/github/dead-letters",
        "/v1/audit?limit=500",
        "/v1/audit?action=subscription.rotate_secret",
        "/v1/activity",
        "/v1/bindings",
        "/metrics",
    ] {
        seen.push((path.to_string(), read(&http, &base, path).await));
    }
    let p = format!("/v1/trigger-subscriptions/{rid}");
    seen.push((p.clone(), read(&http, &base, &p).await));
    let ids = |text: &str, list: &str, key: &str| -> Vec<String> {
        let v: Value = serde_json::from_str(text).unwrap();
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x[key].as_str().unwrap().to_string())
            .collect()
    };
    let (receipts, deliveries, runs) = (seen[0].1.clone(), seen[1].1.clone(), seen[2].1.clone());
    for id in ids(&receipts, "receipts", "receiptId") {
        let p = format!("/v1/receipts/{id}");
        seen.push((p.clone(), read(&http, &base, &p).await));
    }
    for id in ids(&deliveries, "deliveries", "deliveryId") {
        let p = format!("/v1/deliveries/{id}");
        seen.push((p.clone(), read(&http, &base, &p).await));
    }
    for id in ids(&runs, "runs", "runId") {
        let p = format!("/v1/runs/{id}/events/poll");
        seen.push((p.clone(), read(&http, &base, &p).await));
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = worker.kill();
    let _ = worker.wait();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("DEBUG")
            && logged.contains("delivery attempt failed")
            && logged.contains("request refused"),
        "the server logged at debug, the failed attempts and the refusals: {logged}"
    );
    assert!(
        seen.iter()
            .any(|(p, t)| p.starts_with("/v1/deliveries/") && t.contains("http_500")),
        "failed attempts were recorded"
    );
    seen.push(("server log".into(), logged));
    let secrets: Vec<(&str, Vec<u8>)> = vec![
        ("github", GH.into()),
        ("github previous", GH_OLD.into()),
        ("standard-webhooks", sw.clone().into_bytes()),
        ("hmac", HMAC.into()),
        ("worker", worker_secret.clone().into_bytes()),
        ("api key", API_KEY.into()),
        ("registered", registered.clone().into_bytes()),
        ("rotated", rotated.clone().into_bytes()),
    ];
    for (what, s) in &secrets {
        for spelled in spellings(s) {
            for (where_, text) in &seen {
                assert!(
                    !text.contains(&spelled),
                    "the {what} secret ({spelled:?}) appears in {where_}"
                );
            }
        }
    }
}
