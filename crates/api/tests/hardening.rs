//! Issue #9 (attack review): route-declared auth, idempotency scope, announced run ids, signal paging
//! and expiry, and waiters woken by the end of their run.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use trigger_bridge_api::auth::{Access, ApiKey};

fn app_state(s: &Server) -> trigger_bridge_api::AppState {
    trigger_bridge_api::AppState {
        engine: s.engine.clone(),
        metrics: None,
        host: Default::default(),
        keys: trigger_bridge_api::auth::ApiKeys(Arc::new(Vec::new())),
        secrets: None,
    }
}

/// Every route of the table that is not public answers 401 without a key (so a new route cannot
/// forget its scope), the public set is exactly the declared one, and a path that merely ends in
/// `/ingest` is not public.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_guarded_route_needs_a_key_and_a_path_ending_in_ingest_is_not_public() {
    let s = start_with_keys(
        None,
        fast_retry(2),
        0,
        vec![ApiKey::full_scope("admin", "admin-key")],
    )
    .await;
    let routes = trigger_bridge_api::routes(app_state(&s));
    let table = routes.table();
    assert!(table.len() > 40, "{}", table.len());
    let mut public: Vec<String> = Vec::new();
    for r in table {
        let path = r
            .path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "x" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        match r.access {
            Access::Public => public.push(format!("{} {}", r.method, r.path)),
            Access::Scope(_) => {
                let resp = s
                    .http
                    .request(r.method.clone(), format!("{}{path}", s.base))
                    .header("content-type", "application/json")
                    .body("{}")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status().as_u16(), 401, "{} {}", r.method, r.path);
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["error"], "unauthenticated", "{} {}", r.method, r.path);
            }
        }
    }
    public.sort();
    assert_eq!(
        public,
        vec![
            "GET /.well-known/openwop",
            "GET /health",
            "GET /metrics",
            "GET /v1/openapi.json",
            "POST /v1/hooks/{token}",
            "POST /v1/trigger-subscriptions/{id}/ingest",
        ]
    );
    // The old bypass: a subscription id `ingest` read without a key.
    for path in [
        "/v1/trigger-subscriptions/ingest",
        "/v1/trigger-subscriptions/x/dead-letters?x=/ingest",
    ] {
        let r = s
            .http
            .get(format!("{}{path}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path}");
    }
    let r = s
        .http
        .get(format!("{}/v1/trigger-subscriptions/ingest", s.base))
        .bearer_auth("admin-key")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Public routes stay public.
    let r = s
        .http
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// One Idempotency-Key and one body start one run whatever the query string; a key that is not
/// visible ASCII is 400 `validation_error`, never ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_ignores_the_query_and_refuses_a_non_ascii_key() {
    let s = start(None, fast_retry(2), 0).await;
    let body = json!({"workflowId": "conformance-noop", "inputs": {"n": 1}});
    let mut ids = Vec::new();
    for q in ["", "?a=1", "?a=2"] {
        let r = s
            .http
            .post(format!("{}/v1/runs{q}", s.base))
            .header("idempotency-key", "one-key")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "{q}");
        let v: Value = r.json().await.unwrap();
        ids.push(v["runId"].as_str().unwrap().to_string());
    }
    assert_eq!(ids[0], ids[1]);
    assert_eq!(ids[0], ids[2]);
    for bad in [&b"cl\xc3\xa9"[..], b"has space", b""] {
        let r = s
            .http
            .post(format!("{}/v1/runs", s.base))
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(bad).unwrap(),
            )
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{bad:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "validation_error");
    }
    // Nothing but the one run was started.
    s.wait_for(&format!("/v1/runs/{}", ids[0]), |v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(s.get("/v1/runs").await["runs"].as_array().unwrap().len(), 1);
}
