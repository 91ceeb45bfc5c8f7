//! `serve --otlp-endpoint`: the binary exports its spans over OTLP/HTTP (protobuf) to a
//! collector, here an in-process one that keeps every request. A webhook carrying a `traceparent`
//! shows up there as a `receipt` span in the sender's trace and an `attempt` span linked to it,
//! under the resource `service.name = trigger-bridge`.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use prost::Message;

use common::*;

/// One request the collector got: path, content type, body.
type Got = (String, String, Vec<u8>);

/// A minimal OTLP/HTTP collector on a free port: answers every POST `200` with an empty body and
/// keeps what it was sent.
fn collector() -> (u16, Arc<Mutex<Vec<Got>>>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let path = line.split(' ').nth(1).unwrap_or_default().to_string();
                let (mut len, mut ctype) = (0usize, String::new());
                loop {
                    let mut h = String::new();
                    r.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap();
                    match k.to_ascii_lowercase().as_str() {
                        "content-length" => len = v.trim().parse().unwrap(),
                        "content-type" => ctype = v.trim().to_string(),
                        _ => {}
                    }
                }
                let mut body = vec![0; len];
                r.read_exact(&mut body).unwrap();
                g.lock().unwrap().push((path, ctype, body));
                conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                    .unwrap();
            }
        }
    });
    (port, got)
}

#[test]
fn spans_reach_an_otlp_collector_with_the_senders_trace_and_the_attempts_link() {
    let (cport, got) = collector();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("otlp.toml");
    std::fs::write(
        &config,
        r#"
[[subscriptions]]
id = "github"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "noop"
"#,
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--otlp-endpoint", &format!("http://127.0.0.1:{cport}")])
        .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
        // Export each batch within 100 ms (the SDK's default is 5 s).
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn server");
    // Killed however the test ends.
    let _child = Killed(child);
    let base = format!("http://127.0.0.1:{port}");
    let healthy = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(25));
        ureq_get(&format!("{base}/health")).is_some()
    });
    assert!(healthy, "server did not become healthy");

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let body = std::fs::read(fixtures().join("github/pull_request/00-opened.json")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = rt.block_on(async {
        reqwest::Client::new()
            .post(format!("{base}/v1/trigger-subscriptions/github/ingest"))
            .header("content-type", "application/json")
            .header("x-github-event", "pull_request")
            .header("x-github-delivery", "otlp-1")
            .header(
                "x-hub-signature-256",
                tb_ingress::github::sign(GH_SECRET.as_bytes(), &body),
            )
            .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
            .body(body)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    });
    assert_eq!(status, 202);

    // Within 10 s the collector has both spans.
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        let all = got.lock().unwrap().clone();
        let mut spans = Vec::new();
        for (path, ctype, body) in &all {
            assert_eq!(path, "/v1/traces");
            assert_eq!(ctype, "application/x-protobuf");
            let req = ExportTraceServiceRequest::decode(&body[..]).expect("OTLP protobuf");
            for rs in req.resource_spans {
                let attrs = rs.resource.map(|r| r.attributes).unwrap_or_default();
                let service = attrs
                    .iter()
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| kv.value.clone())
                    .and_then(|v| v.value);
                assert_eq!(
                    service,
                    Some(any_value::Value::StringValue("trigger-bridge".into()))
                );
                spans.extend(rs.scope_spans.into_iter().flat_map(|s| s.spans));
            }
        }
        let names = |n: &str| spans.iter().filter(|s| s.name == n).count();
        if names("receipt") == 1 && names("attempt") == 1 {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "no receipt and attempt spans within 10 s; got {} requests",
            all.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let receipt = spans.iter().find(|s| s.name == "receipt").unwrap();
    let attempt = spans.iter().find(|s| s.name == "attempt").unwrap();
    // The receipt span is the sender's span's child; the attempt is its own trace, linked to it.
    assert_eq!(hex::encode(&receipt.trace_id), trace);
    assert_eq!(hex::encode(&receipt.parent_span_id), "00f067aa0ba902b7");
    assert_ne!(attempt.trace_id, receipt.trace_id);
    assert!(
        attempt.parent_span_id.is_empty(),
        "an attempt span is a root"
    );
    assert_eq!(attempt.links.len(), 1);
    assert_eq!(attempt.links[0].trace_id, receipt.trace_id);
    assert_eq!(attempt.links[0].span_id, receipt.span_id);
}

/// A child process killed (and reaped) when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
