//! Traces across the durable boundary, asserted on the spans the OpenTelemetry SDK
//! exports (its in-memory exporter, behind the same `tracing-opentelemetry` layer `serve` installs):
//!
//! - a webhook carrying a W3C `traceparent` gets a `receipt` span that is the sender's span's child;
//! - each attempt is its own trace, LINKED to that receipt span (no span lives as long as the retries);
//! - the http executor sends each attempt's own context as `traceparent`;
//! - the link is read from the stored delivery, so an attempt made by a restarted engine (another
//!   store handle, nothing in memory) links to the receipt span all the same.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use support::*;
use tb_core::connector::ConnectorSpec;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, Engine, SubscriptionConfig};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

const SENDER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SENDER_SPAN: &str = "00f067aa0ba902b7";

/// The exporter behind the process-wide subscriber (installed once: every test of this binary
/// shares it and picks out its own spans by receipt id).
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("test"))
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(tb_engine::trace::TARGET, tracing::Level::TRACE),
            );
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only subscriber of this test binary");
        // Kept for the life of the process (dropping it would shut the exporter down).
        std::mem::forget(provider);
        exporter
    })
}

fn attr(s: &SpanData, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The finished spans named `name` whose attribute `key` is `value`.
fn spans(name: &str, key: &str, value: &str) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|s| s.name == name && attr(s, key).as_deref() == Some(value))
        .collect()
}

/// A worker answering `codes` in turn (then 200) that keeps every `traceparent` it was sent.
async fn tracing_worker(codes: Vec<u16>) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let n = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let s = s.clone();
            let n = n.fetch_add(1, Ordering::SeqCst);
            let code = *codes.get(n).unwrap_or(&200);
            async move {
                let all: Vec<String> = headers
                    .get_all("traceparent")
                    .iter()
                    .map(|v| v.to_str().unwrap().to_string())
                    .collect();
                assert_eq!(all.len(), 1, "exactly one traceparent: {all:?}");
                s.lock().unwrap().push(all[0].clone());
                axum::http::StatusCode::from_u16(code).unwrap()
            }
        }),
    );
    let (url, _) = serve_worker(app, Arc::new(AtomicUsize::new(0))).await;
    (url, seen)
}

fn catalog(url: String) -> Catalog {
    let sub = SubscriptionConfig {
        retry: fast_retry(3),
        ..SubscriptionConfig::webhook("github", ConnectorSpec::Github, GH_SECRET.as_bytes())
    };
    let wf = Workflow {
        id: "pr-triage".into(),
        executor: Executor::Http {
            url,
            secret: WORKER_KEY.to_vec(),
            timeout_ms: 2_000,
            allow_private: true,
            non_retryable_statuses: vec![410],
        },
    };
    Catalog::new(
        vec![sub],
        vec![opened_binding("b", "github", "pr-triage", 0)],
        vec![wf],
    )
}

/// POSTs a signed GitHub `pull_request` event with `traceparent` (when given) to `base`.
async fn post(base: &str, delivery: &str, traceparent: Option<&str>) -> serde_json::Value {
    let body = opened();
    let mut r = reqwest::Client::new()
        .post(format!("{base}/v1/trigger-subscriptions/github/ingest"))
        .header("content-type", "application/json")
        .header("x-github-event", "pull_request")
        .header("x-github-delivery", delivery)
        .header(
            "x-hub-signature-256",
            tb_ingress::github::sign(GH_SECRET.as_bytes(), &body),
        );
    if let Some(t) = traceparent {
        r = r.header("traceparent", t);
    }
    let r = r.body(body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_is_its_own_trace_linked_to_the_receipt_span() {
    exporter();
    // The first attempt fails (503), the second is delivered: two attempt spans.
    let (url, seen) = tracing_worker(vec![503]).await;
    let (dir, store) = store();
    let s = serve(dir, store, catalog(url), Vec::new()).await;
    let sent = format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01");
    let v = post(&s.base, "trace-1", Some(&sent)).await;
    let receipt = v["receiptId"].as_str().unwrap().to_string();
    let delivery = v["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s
        .wait_for(&format!("/v1/deliveries/{delivery}"), |d| {
            d["delivery"]["state"] == "delivered"
        })
        .await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 2, "{d}");

    // The receipt span continues the sender's trace, as a child of its remote span.
    let r = spans("receipt", "receipt", &receipt);
    assert_eq!(r.len(), 1, "one receipt span");
    let r = &r[0];
    assert_eq!(
        r.span_context.trace_id(),
        TraceId::from_hex(SENDER_TRACE).unwrap()
    );
    assert_eq!(r.parent_span_id, SpanId::from_hex(SENDER_SPAN).unwrap());
    assert!(r.parent_span_is_remote);
    assert_eq!(attr(r, "subscription").as_deref(), Some("github"));
    // What the delivery keeps is exactly that span's context.
    let stored = format!(
        "00-{}-{}-01",
        r.span_context.trace_id(),
        r.span_context.span_id()
    );
    assert_eq!(d["delivery"]["traceContext"], stored.as_str(), "{d}");

    // Each attempt: a root of a new trace with one link, to the receipt span. An attempt's span ends
    // after its commit, so the second may end just after the delivery reads delivered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while spans("attempt", "delivery", &delivery).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "two attempt spans within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut attempts = spans("attempt", "delivery", &delivery);
    attempts.sort_by_key(|a| attr(a, "attempt"));
    assert_eq!(attempts.len(), 2, "one span per attempt");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(attr(a, "attempt").as_deref(), Some(&*(i + 1).to_string()));
        assert_eq!(
            a.parent_span_id,
            SpanId::INVALID,
            "an attempt span is a root"
        );
        assert_ne!(a.span_context.trace_id(), r.span_context.trace_id());
        assert_eq!(a.links.links.len(), 1);
        let link = &a.links.links[0].span_context;
        assert_eq!(link.trace_id(), r.span_context.trace_id());
        assert_eq!(link.span_id(), r.span_context.span_id());
    }
    assert_ne!(
        attempts[0].span_context.trace_id(),
        attempts[1].span_context.trace_id()
    );

    // The worker was sent each attempt's own context, in order.
    let sent_to_worker = seen.lock().unwrap().clone();
    let expected: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "00-{}-{}-01",
                a.span_context.trace_id(),
                a.span_context.span_id()
            )
        })
        .collect();
    assert_eq!(sent_to_worker, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_traceparent_starts_a_trace_and_a_bad_one_is_ignored() {
    exporter();
    let (url, _) = tracing_worker(vec![]).await;
    let (dir, store) = store();
    let s = serve(dir, store, catalog(url), Vec::new()).await;
    for (key, header) in [
        ("trace-none", None),
        ("trace-bad", Some("00-not-a-trace-01")),
        (
            "trace-zero",
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        ),
    ] {
        let v = post(&s.base, key, header).await;
        let receipt = v["receiptId"].as_str().unwrap();
        let r = spans("receipt", "receipt", receipt);
        assert_eq!(r.len(), 1, "{key}");
        assert_eq!(r[0].parent_span_id, SpanId::INVALID, "{key}: a new root");
        assert_ne!(r[0].span_context.trace_id(), TraceId::INVALID, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_after_a_restart_links_to_the_stored_receipt_span() {
    exporter();
    let (url, seen) = tracing_worker(vec![]).await;
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn tb_store::Store> {
        Arc::new(tb_store::sqlite::SqliteStore::open_dir(dir.path()).unwrap())
    };
    // Before the restart: the event is accepted by an engine with no worker (nothing is attempted).
    let (receipt, delivery) = {
        let engine = Engine::start(open(), catalog(url.clone())).await.unwrap();
        let body = bytes::Bytes::from(opened());
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", "application/json".parse().unwrap());
        headers.insert("x-github-event", "pull_request".parse().unwrap());
        headers.insert("x-github-delivery", "trace-restart".parse().unwrap());
        headers.insert(
            "x-hub-signature-256",
            tb_ingress::github::sign(GH_SECRET.as_bytes(), &body)
                .parse()
                .unwrap(),
        );
        headers.insert(
            "traceparent",
            format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01")
                .parse()
                .unwrap(),
        );
        let answer = tb_engine::ingest::ingest(&engine, "github", &headers, body)
            .await
            .unwrap();
        let tb_engine::accept::IngestAnswer::Accepted {
            receipt_id,
            deliveries,
            ..
        } = answer
        else {
            panic!("accepted: {answer:?}")
        };
        (receipt_id, deliveries[0].delivery_id.clone())
    };
    let r = spans("receipt", "receipt", &receipt);
    assert_eq!(r.len(), 1);
    let receipt_span = r[0].span_context.clone();
    assert!(spans("attempt", "delivery", &delivery).is_empty());

    // After it: a new engine on a new store handle attempts the delivery.
    let store = open();
    let engine = Engine::start(store.clone(), catalog(url)).await.unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(tb_engine::worker::run(
        engine.clone(),
        Default::default(),
        rx,
    ));
    let mut delivered = false;
    for _ in 0..400 {
        if store.get_delivery(&delivery).await.unwrap().state
            == tb_core::delivery::DeliveryState::Delivered
        {
            delivered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(delivered, "the restarted engine delivered it within 10 s");
    // The worker waits for its attempts in flight before it returns: the span has ended then.
    tx.send(true).unwrap();
    worker.await.unwrap();
    let a = spans("attempt", "delivery", &delivery);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].links.links.len(), 1);
    let link = &a[0].links.links[0].span_context;
    assert_eq!(link.trace_id(), receipt_span.trace_id());
    assert_eq!(link.span_id(), receipt_span.span_id());
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![format!(
            "00-{}-{}-01",
            a[0].span_context.trace_id(),
            a[0].span_context.span_id()
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_through_the_api_continues_the_callers_trace() {
    exporter();
    let (url, seen) = tracing_worker(vec![]).await;
    let (dir, store) = store();
    let s = serve(dir, store, catalog(url), Vec::new()).await;
    let r = s
        .http
        .post(format!("{}/v1/runs", s.base))
        .header("traceparent", format!("00-{SENDER_TRACE}-{SENDER_SPAN}-01"))
        .json(&serde_json::json!({"workflowId": "pr-triage"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    let run = s
        .wait_for(&format!("/v1/runs/{}", v["runId"].as_str().unwrap()), |r| {
            r["trigger"]["receiptId"].is_string()
        })
        .await;
    let receipt = run["trigger"]["receiptId"].as_str().unwrap();
    let r = spans("receipt", "receipt", receipt);
    assert_eq!(r.len(), 1, "{run}");
    assert_eq!(
        r[0].span_context.trace_id(),
        TraceId::from_hex(SENDER_TRACE).unwrap()
    );
    assert_eq!(r[0].parent_span_id, SpanId::from_hex(SENDER_SPAN).unwrap());
    assert_eq!(attr(&r[0], "source").as_deref(), Some("api"));
    // Its attempt reached the worker with the attempt's own context.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker was called within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let sent = seen.lock().unwrap()[0].clone();
    assert!(
        sent.starts_with("00-") && !sent.contains(SENDER_TRACE),
        "{sent}"
    );
}
