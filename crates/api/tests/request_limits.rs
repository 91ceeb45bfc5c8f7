//! The request limits of docs/limits.md, over HTTP: each one ends in its 4xx with its
//! stable code and the limit's key in the message, and stores nothing (no receipt).

mod support;

use std::io::Write;

use axum::http::StatusCode;
use serde_json::Value;
use support::*;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::limits::{ContentCoding, JsonLimits, Limits};
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, SubscriptionConfig};

async fn server(limits: Limits) -> Server {
    let (dir, store) = store();
    let sub = SubscriptionConfig {
        limits,
        max_body_bytes: 256 * 1024,
        ..SubscriptionConfig::webhook("github", ConnectorSpec::Github, GH_SECRET.as_bytes())
    };
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "any".into(),
        subscription: "github".into(),
        event_types: vec!["pull_request.opened".into()],
        filter: Default::default(),
        action: BindingAction::start_run("wf"),
        inputs: Default::default(),
    };
    let wf = Workflow {
        id: "wf".into(),
        executor: Executor::Noop,
    };
    serve(
        dir,
        store,
        Catalog::new(vec![sub], vec![binding], vec![wf]),
        Vec::new(),
    )
    .await
}

fn tight() -> Limits {
    Limits {
        json: JsonLimits {
            max_depth: 8,
            max_string_bytes: 1024,
            max_fields: 2000,
        },
        max_headers: 20,
        max_header_bytes: 2048,
        ..Limits::default()
    }
}

async fn receipts(s: &Server) -> usize {
    s.get("/v1/receipts").await["receipts"]
        .as_array()
        .map_or(0, Vec::len)
}

fn assert_refused(r: &(StatusCode, Value), status: u16, code: &str, key: &str) {
    assert_eq!(r.0.as_u16(), status, "{:?}", r.1);
    assert_eq!(r.1["error"], code, "{:?}", r.1);
    let msg = r.1["message"].as_str().unwrap();
    assert!(msg.contains(key), "{msg}");
}

#[tokio::test]
async fn deep_nesting_long_strings_and_many_fields_are_413_and_store_nothing() {
    let s = server(tight()).await;
    let deep = format!(
        r#"{{"action":"opened","x":{}1{}}}"#,
        "[".repeat(20),
        "]".repeat(20)
    );
    let r = s
        .post_github("pull_request", "d-deep", deep.into_bytes(), GH_SECRET)
        .await;
    assert_refused(&r, 413, "payload_too_large", "max_json_depth");
    let long = format!(r#"{{"action":"opened","x":"{}"}}"#, "a".repeat(5000));
    let r = s
        .post_github("pull_request", "d-long", long.into_bytes(), GH_SECRET)
        .await;
    assert_refused(&r, 413, "payload_too_large", "max_json_string_bytes");
    let many = format!(r#"{{"action":"opened","x":[{}0]}}"#, "0,".repeat(5000));
    let r = s
        .post_github("pull_request", "d-many", many.into_bytes(), GH_SECRET)
        .await;
    assert_refused(&r, 413, "payload_too_large", "max_json_fields");
    // Invalid UTF-8 inside a JSON string of an authentic body.
    let r = s
        .post_github(
            "pull_request",
            "d-utf8",
            b"{\"action\":\"opened\",\"x\":\"\xff\xfe\"}".to_vec(),
            GH_SECRET,
        )
        .await;
    assert_eq!(r.0.as_u16(), 422, "{:?}", r.1);
    assert_eq!(r.1["error"], "unprocessable_event");
    assert_eq!(receipts(&s).await, 0, "nothing stored");
    // Within the limits the same subscription accepts.
    let r = s
        .post_github("pull_request", "d-ok", opened(), GH_SECRET)
        .await;
    assert_eq!(r.0, StatusCode::ACCEPTED, "{:?}", r.1);
    assert_eq!(receipts(&s).await, 1);
}

#[tokio::test]
async fn header_floods_are_431_before_the_body_is_read() {
    let s = server(tight()).await;
    let url = format!("{}/v1/trigger-subscriptions/github/ingest", s.base);
    let mut req = s.http.post(&url).body(opened());
    for i in 0..30 {
        req = req.header(format!("x-flood-{i}"), "1");
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 431);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "headers_too_large");
    assert!(v["message"].as_str().unwrap().contains("max_headers"));
    let r = s
        .http
        .post(&url)
        .header("x-big", "b".repeat(4000))
        .body(opened())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 431);
    let v: Value = r.json().await.unwrap();
    assert!(v["message"].as_str().unwrap().contains("max_header_bytes"));
    // Past the server's own cap (256) the HTTP parser answers 431 itself.
    let mut req = s.http.post(&url).body(opened());
    for i in 0..300 {
        req = req.header(format!("x-flood-{i}"), "1");
    }
    assert_eq!(req.send().await.unwrap().status().as_u16(), 431);
    assert_eq!(receipts(&s).await, 0);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

async fn post_gzip(s: &Server, delivery: &str, plain: &[u8], wire: Vec<u8>) -> (u16, Value) {
    // GitHub signs the representation: the decoded bytes.
    let sig = tb_ingress::github::sign(GH_SECRET.as_bytes(), plain);
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/github/ingest", s.base))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .header("x-github-event", "pull_request")
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", sig)
        .body(wire)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn gzip_is_refused_unless_configured_and_a_bomb_stops_at_its_cap() {
    let s = server(Limits::default()).await;
    let plain = opened();
    let (st, v) = post_gzip(&s, "g-1", &plain, gzip(&plain)).await;
    assert_eq!(st, 415, "{v:?}");
    assert_eq!(v["error"], "unsupported_media_type");

    let s = server(Limits {
        content_encodings: vec![ContentCoding::Gzip],
        ..Limits::default()
    })
    .await;
    let (st, v) = post_gzip(&s, "g-2", &plain, gzip(&plain)).await;
    assert_eq!(st, 202, "{v:?}");
    // 64 MiB of zeros in ~64 KiB: stopped at the size cap (max_body_bytes, 256 KiB) ...
    let bomb = gzip(&vec![0u8; 64 << 20]);
    assert!(bomb.len() < 128 * 1024);
    let (st, v) = post_gzip(&s, "g-3", b"", bomb.clone()).await;
    assert_eq!(st, 413, "{v:?}");
    let msg = v["message"].as_str().unwrap().to_string();
    assert!(msg.contains("max_decompressed_bytes"), "{msg}");
    let (st, v) = post_gzip(&s, "g-4", b"", b"not gzip at all".to_vec()).await;
    assert_eq!(st, 400, "{v:?}");
    assert_eq!(receipts(&s).await, 1, "only the accepted one");
    // ... or at the ratio when that is the smaller cap.
    let s = server(Limits {
        content_encodings: vec![ContentCoding::Gzip],
        max_decompression_ratio: 2,
        ..Limits::default()
    })
    .await;
    let (st, v) = post_gzip(&s, "g-5", b"", bomb).await;
    assert_eq!(st, 413, "{v:?}");
    let msg = v["message"].as_str().unwrap().to_string();
    assert!(msg.contains("max_decompression_ratio"), "{msg}");
    assert_eq!(receipts(&s).await, 0);
}
