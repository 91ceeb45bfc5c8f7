//! From an attack review: route-declared auth, idempotency scope, announced run ids, signal paging
//! and expiry, and waiters woken by the end of their run.

mod support;

use std::sync::Arc;

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
        vec![ApiKey::full_scope("admin", "admin-key"), {
            let mut k = ApiKey::full_scope("scopeless", "scopeless-key");
            k.scopes = Vec::new();
            k
        }],
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
            Access::AnyKey => {
                let url = format!("{}{path}", s.base);
                let resp = s.http.get(&url).send().await.unwrap();
                assert_eq!(resp.status().as_u16(), 401, "{} {}", r.method, r.path);
                // Any known key, even one without scopes, may call it.
                let resp = s
                    .http
                    .get(&url)
                    .bearer_auth("scopeless-key")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status().as_u16(), 200, "{} {}", r.method, r.path);
            }
            Access::Scope(_) | Access::RunExecutor => {
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
                // A known key without the route's scope is 403: the scope is enforced per route.
                let resp = s
                    .http
                    .request(r.method.clone(), format!("{}{path}", s.base))
                    .bearer_auth("scopeless-key")
                    .header("content-type", "application/json")
                    .body("{}")
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status().as_u16(), 403, "{} {}", r.method, r.path);
            }
        }
    }
    // Every literal segment that follows `/v1/trigger-subscriptions/` in a route is a reserved
    // subscription id, so no subscription can collide with a route.
    for r in table {
        let Some(rest) = r.path.strip_prefix("/v1/trigger-subscriptions/") else {
            continue;
        };
        let segs: Vec<&str> = rest.split('/').collect();
        let literal = match segs.as_slice() {
            [one] if !one.starts_with('{') => Some(*one),
            [id, seg, ..] if id.starts_with('{') => Some(*seg),
            _ => None,
        };
        if let Some(seg) = literal {
            assert!(
                tb_core::ids::RESERVED_SUBSCRIPTION_IDS.contains(&seg),
                "{} {}: add {seg:?} to RESERVED_SUBSCRIPTION_IDS",
                r.method,
                r.path
            );
        }
    }
    public.sort();
    assert_eq!(
        public,
        vec![
            "GET /.well-known/openwop",
            "GET /health",
            "GET /metrics",
            "GET /ready",
            "GET /v1/openapi.json",
            "POST /v1/hooks/{token}",
            "POST /v1/trigger-subscriptions/{id}/ingest",
        ]
    );
    // The old bypass: a subscription id `ingest` read without a key.
    let r = s
        .http
        .get(format!("{}/v1/trigger-subscriptions/ingest", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
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
    // Two Idempotency-Key headers are refused too, never "first one wins".
    for keys in [["k1", "k2"], ["one-key", "one-key"]] {
        let r = s
            .http
            .post(format!("{}/v1/runs", s.base))
            .header("idempotency-key", keys[0])
            .header("idempotency-key", keys[1])
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{keys:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "validation_error");
        assert_eq!(v["message"], "send one Idempotency-Key header, not several");
    }
    // Nothing but the one run was started.
    s.wait_for(&format!("/v1/runs/{}", ids[0]), |v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(s.get("/v1/runs").await["runs"].as_array().unwrap().len(), 1);
    // Path params are part of the scope: one key on two runs is two operations, not a replay.
    let (_, other) = s
        .post("/v1/runs", json!({"workflowId": "conformance-noop"}))
        .await;
    let other = other["runId"].as_str().unwrap().to_string();
    s.wait_for(&format!("/v1/runs/{other}"), |v| v["status"] == "completed")
        .await;
    for run in [&ids[0], &other] {
        let r = s
            .http
            .post(format!("{}/v1/runs/{run}/cancel", s.base))
            .header("idempotency-key", "cancel-key")
            .send()
            .await
            .unwrap();
        assert!(
            r.headers()
                .get("openwop-idempotent-replay")
                .is_none_or(|v| v != "true"),
            "{run}"
        );
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "conflict", "{run}: the run already ended");
    }
}

/// `POST /v1/runs` holds its body to the ingest JSON limits: inputs nested past depth 64 are 413
/// and start nothing (they would come back deeper in every run view and start turn than a reader
/// parses).
#[tokio::test]
async fn a_run_whose_inputs_nest_too_deep_is_refused_and_starts_nothing() {
    let s = start(None, fast_retry(2), 0).await;
    let nested = |depth: usize| format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    let send = |depth: usize| {
        let body = format!(
            r#"{{"workflowId": "conformance-noop", "inputs": {}}}"#,
            nested(depth)
        );
        let (http, base) = (s.http.clone(), s.base.clone());
        async move {
            let r = http
                .post(format!("{base}/v1/runs"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, v) = send(126).await;
    assert_eq!(
        (status, v["error"].clone()),
        (413, json!("payload_too_large")),
        "{v}"
    );
    assert!(
        v["message"].as_str().unwrap().contains("max_json_depth"),
        "{v}"
    );
    assert_eq!(s.get("/v1/runs").await["runs"].as_array().unwrap().len(), 0);
    // At the limit (the body's own object is depth 1): accepted.
    let (status, v) = send(63).await;
    assert_eq!(status, 201, "{v}");
}

/// A worker whose every request waits for a permit, then answers the next of `codes` (then 200).
async fn gated_worker(codes: Vec<u16>) -> (String, Arc<tokio::sync::Semaphore>) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let g = gate.clone();
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move || {
            let (g, n, codes) = (g.clone(), n.clone(), codes.clone());
            async move {
                g.acquire().await.unwrap().forget();
                let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                axum::http::StatusCode::from_u16(*codes.get(i).unwrap_or(&200)).unwrap()
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/run", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, gate)
}

/// An announced run id always resolves: `pending`, then `failed` with `statusReason: dead_lettered`
/// and its `deliveryId` once the delivery is dead-lettered, `pending` again after a replay, then the
/// run itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_run_id_never_vanishes_through_dead_letter_and_replay() {
    let (url, gate) = gated_worker(vec![500, 500]).await;
    let s = start(Some(url), fast_retry(2), 0).await;
    let (_, a) = s
        .post_github("pull_request", "vanish-1", opened(), GH_SECRET)
        .await;
    let run_id = a["runId"].as_str().unwrap().to_string();
    let d_id = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let run_url = format!("{}/v1/runs/{run_id}", s.base);
    let r = s.http.get(&run_url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "pending", "{v}");
    gate.add_permits(2);
    s.wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
        v["delivery"]["state"] == "dead-lettered"
    })
    .await;
    let r = s.http.get(&run_url).send().await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "a dead-lettered run id must resolve"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["runId"], run_id.as_str());
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["statusReason"], "dead_lettered");
    assert_eq!(v["deliveryId"], d_id.as_str());
    // Cancelling it is a conflict that says why.
    let (st, c) = s
        .post(&format!("/v1/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(st.as_u16(), 409);
    assert!(
        c["message"].as_str().unwrap().contains("dead-lettered"),
        "{c}"
    );
    // Its events poll answers too: no events, complete.
    let poll = s.get(&format!("/v1/runs/{run_id}/events/poll")).await;
    assert_eq!(poll["events"], json!([]));
    assert_eq!(poll["isComplete"], true);
    let r = s
        .http
        .post(format!("{}/v1/deliveries/{d_id}/replay", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v = s.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(v["status"], "pending", "after a replay: {v}");
    assert!(v.get("statusReason").is_none(), "{v}");
    gate.add_permits(1);
    let v = s
        .wait_for(&format!("/v1/runs/{run_id}"), |v| {
            v["status"] == "completed"
        })
        .await;
    assert_eq!(v["trigger"]["deliveryId"], d_id.as_str());
}

/// A delivery a worker holds reads `in-flight` with its lease owner and expiry (not `pending` with the
/// lease expiry as its next attempt), and its stored state again once the attempt is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_flight_shows_who_holds_it_and_until_when() {
    let (url, gate) = gated_worker(vec![]).await;
    let s = start(Some(url), fast_retry(2), 0).await;
    let (_, a) = s
        .post_github("pull_request", "inflight-1", opened(), GH_SECRET)
        .await;
    let d_id = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let v = s
        .wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
            v["delivery"]["state"] == "in-flight"
        })
        .await;
    let d = &v["delivery"];
    assert_eq!(d["attempts"], 0);
    assert!(
        d["leaseOwner"].as_str().unwrap().starts_with("worker-"),
        "{d}"
    );
    assert!(d["leaseExpiresAt"].is_string(), "{d}");
    assert!(d.get("nextAttemptAt").is_none(), "{d}");
    let listed = s.get("/v1/deliveries").await;
    assert_eq!(listed["deliveries"][0]["state"], "in-flight", "{listed}");
    gate.add_permits(1);
    let v = s
        .wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
            v["delivery"]["state"] == "delivered"
        })
        .await;
    assert!(v["delivery"].get("leaseOwner").is_none(), "{v}");
}

/// `?state=` of the receipt list takes only states a receipt can be in: a timeline-only word is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_list_refuses_timeline_only_states() {
    let s = start(None, fast_retry(2), 0).await;
    for bad in ["received", "matched", "duplicate", "nope"] {
        let r = s
            .http
            .get(format!("{}/v1/receipts?state={bad}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{bad}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "validation_error");
        assert!(
            v["message"].as_str().unwrap().contains("dead_lettered"),
            "{v}"
        );
    }
    let ok = s.get("/v1/receipts?state=consumed").await;
    assert_eq!(ok["receipts"], json!([]));
}
