//! What the public surface costs and gives away (docs/limits.md "Public reads", "Wrong API keys";
//! docs/operations.md "Metrics"): `/v1/openapi.json` is built once and revalidated by its `ETag`;
//! `/metrics` and `/ready` never name a subscription registered through the API (its id is the
//! unguessable part of its ingest URL); wrong bearer keys are throttled per client address.
//!
//! One metrics recorder per process: the tests here read it as deltas or as series only they write.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;
use std::time::Instant;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{json, Value};
use support::*;
use tb_core::subscription::SubscriptionInput;
use trigger_bridge_api::openapi::ApiDoc;
use utoipa::OpenApi;

fn recorder() -> &'static PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

/// The value of the sample `name{labels}` in the recorder's text, if present.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

fn local_text() -> String {
    recorder().run_upkeep();
    recorder().render()
}

/// Before: every request rebuilt and serialized the document, with no validator to revalidate by.
#[tokio::test]
async fn the_openapi_document_is_served_from_one_build_with_an_etag() {
    let s = start(None, fast_retry(1), 0).await;
    let url = format!("{}/v1/openapi.json", s.base);
    let first = s.http.get(&url).send().await.unwrap();
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(first.headers()["content-type"], "application/json");
    assert_eq!(first.headers()["x-content-type-options"], "nosniff");
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && etag.len() == 18,
        "{etag}"
    );
    let body = first.bytes().await.unwrap();
    // The very document the annotations describe.
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc, serde_json::to_value(ApiDoc::openapi()).unwrap());
    assert!(doc["paths"]["/v1/openapi.json"].is_null() && doc["paths"]["/ready"].is_object());
    // The same bytes again, under the same tag.
    let second = s.http.get(&url).send().await.unwrap();
    assert_eq!(second.headers()["etag"].to_str().unwrap(), etag);
    assert_eq!(second.bytes().await.unwrap(), body);
    // A client holding it revalidates for nothing.
    let again = s
        .http
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 304);
    assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);
    assert!(again.bytes().await.unwrap().is_empty());
    let other = s
        .http
        .get(&url)
        .header("if-none-match", "\"0000000000000000\"")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status().as_u16(), 200);
    // One build per process: the handler hands out the same allocation every time.
    assert!(std::ptr::eq(
        trigger_bridge_api::openapi::served(),
        trigger_bridge_api::openapi::served()
    ));
}

/// The handler's CPU per request, rebuilt (what every request did before) against cached (now), in
/// this build's profile. Run by hand: `cargo test -p trigger-bridge-api --test exposure openapi_cost
/// -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn openapi_cost() {
    use axum::response::IntoResponse;
    let n = 300;
    let t = Instant::now();
    for _ in 0..n {
        let r = axum::Json(ApiDoc::openapi()).into_response();
        let b = axum::body::to_bytes(r.into_body(), 1 << 22).await.unwrap();
        std::hint::black_box(b);
    }
    let rebuilt = t.elapsed() / n;
    let t = Instant::now();
    for _ in 0..n {
        let r = trigger_bridge_api::openapi::openapi(Default::default()).await;
        let b = axum::body::to_bytes(r.into_body(), 1 << 22).await.unwrap();
        std::hint::black_box(b);
    }
    let cached = t.elapsed() / n;
    println!("openapi.json per request: rebuilt {rebuilt:?}, cached {cached:?}");
}

/// Before: `tb_subscription_quarantined`, `tb_quarantines_total` and
/// `tb_previous_secret_accepted_total` carried the registered subscription's id, and `/ready` listed
/// it among the dead-lettered ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_ready_never_name_a_registered_subscription() {
    recorder();
    let s = start(None, fast_retry(1), 0).await;
    // /metrics over the same engine, rendered by the process recorder.
    let app = trigger_bridge_api::router(trigger_bridge_api::AppState {
        engine: s.engine.clone(),
        metrics: Some(recorder().clone()),
        host: Default::default(),
        keys: Default::default(),
        secrets: None,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_url = format!("http://{}/metrics", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (st, reg) = s
        .post(
            "/v1/trigger-subscriptions",
            json!({"source": "webhook", "workflowId": "conformance-noop"}),
        )
        .await;
    assert_eq!(st.as_u16(), 201, "{reg}");
    let id = reg["subscription"]["subscriptionId"]
        .as_str()
        .unwrap()
        .to_string();
    let ingest = reg["binding"]["ingestUrl"].as_str().unwrap().to_string();
    let old = reg["binding"]["signingSecret"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(ingest.contains(&id));
    // A rotation with an overlap, and a request signed with the previous secret.
    let (st, rot) = s
        .post(
            &format!("/v1/trigger-subscriptions/{id}/rotate-secret"),
            json!({"overlapSeconds": 3600}),
        )
        .await;
    assert_eq!(st.as_u16(), 200, "{rot}");
    let body = br#"{"type":"invoice.paid","data":{"n":1}}"#;
    let (st, a) = post_sw(
        &s,
        &ingest,
        &old,
        "msg_exposure_0000001",
        body,
        chrono_now(),
    )
    .await;
    assert_eq!(st, 202, "{a}");
    // Quarantined by an operator.
    let (st, q) = s
        .post(
            &format!("/v1/trigger-subscriptions/{id}/quarantine"),
            json!({"reason": "looking into it"}),
        )
        .await;
    assert_eq!(st.as_u16(), 200, "{q}");
    // Dead-lettered (continuous failure).
    s.engine
        .store
        .apply_subscription_input(
            &id,
            SubscriptionInput::DeliveryExhausted {
                streak: tb_core::subscription::FailureStreak {
                    last_success_at: None,
                    failures_since: 10,
                    first_failure_at: 0,
                    now: 5 * 86_400_000,
                },
                policy: tb_core::subscription::FailurePolicy::default(),
            },
            5_000,
        )
        .await
        .unwrap()
        .expect("active -> dead-lettered");

    let text = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !text.contains(&id),
        "the registered id is in /metrics:\n{text}"
    );
    // The registered subscriptions are added up under `api`; a configured one keeps its id.
    assert_eq!(
        sample(&text, r#"tb_subscription_quarantined{subscription="api"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"tb_subscription_quarantined{subscription="github"}"#
        ),
        Some(0.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"tb_quarantines_total{subscription="api",by="operator"}"#
        ) >= Some(1.0),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"tb_previous_secret_accepted_total{subscription="api"}"#
        ) >= Some(1.0),
        "{text}"
    );
    // /ready (public) says a registered subscription waits for an operator, not which.
    let ready = s.get("/ready").await;
    assert!(!ready.to_string().contains(&id), "{ready}");
    assert_eq!(
        ready["warnings"]["subscriptions"]["dead-lettered"],
        json!(["api"]),
        "{ready}"
    );
    // Behind a key (this server has none: open) the id is there, as before.
    let list = s.get("/v1/trigger-subscriptions").await;
    assert!(list.to_string().contains(&id));
}

/// Before: every wrong key was a 401, however many, from wherever, and nothing counted them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bearer_keys_from_one_address_are_refused_past_the_limit() {
    recorder();
    let right = "right-key-0123456789abcdef";
    let key = trigger_bridge_api::auth::ApiKey::full_scope("ops", right);
    let s = start_with_keys(None, fast_retry(1), 0, vec![key]).await;
    s.engine.set_failed_keys_limit(5);
    let failures = r#"tb_auth_failures_total{surface="api"}"#;
    let throttled = r#"tb_auth_throttled_total{surface="api"}"#;
    let (f0, t0) = {
        let t = local_text();
        (
            sample(&t, failures).unwrap_or(0.0),
            sample(&t, throttled).unwrap_or(0.0),
        )
    };
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(IpAddr::V4(Ipv4Addr::from(ip)))
            .build()
            .unwrap()
    };
    let (a, b) = (from([127, 0, 0, 1]), from([127, 0, 0, 2]));
    let url = format!("{}/v1/auth/key", s.base);
    let ask = |c: &reqwest::Client, key: &str| c.get(&url).bearer_auth(key).send();
    for i in 0..5 {
        let r = ask(&a, &format!("guess-{i}")).await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "wrong key {i}");
    }
    // The sixth from the same address is refused unchecked, and so is the right key: answering it
    // 200 would tell a right guess from a wrong one.
    for k in ["guess-5", right] {
        let r = ask(&a, k).await.unwrap();
        assert_eq!(r.status().as_u16(), 429, "{k}");
        let wait: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "rate_limited");
    }
    // Another address is not held by this one's guesses.
    let r = ask(&b, right).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["name"], "ops");
    assert_eq!(ask(&b, "guess-b").await.unwrap().status().as_u16(), 401);
    // No key at all is no guess: 401 as ever, not counted.
    let r = a.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let t = local_text();
    assert!(sample(&t, failures).unwrap() - f0 >= 6.0, "{t}");
    assert!(sample(&t, throttled).unwrap() - t0 >= 2.0, "{t}");
}
