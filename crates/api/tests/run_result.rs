//! `POST /v1/runs/{id}/result` is the run's executor's report (docs/http-api.md): a session key
//! (`runs:create` + `runs:read`, the scopes docs/mcp.md recommends) cannot end a run through it; the
//! http worker proves it is the run's executor with the run's result token from its signed start
//! request, or an operator gives its key `runs:result`. Every report, accepted or refused, is in the
//! audit log.

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::*;
use trigger_bridge_api::auth::ApiKey;

fn key(name: &str, secret: &str, scopes: &[&str]) -> ApiKey {
    let mut k = ApiKey::full_scope(name, secret);
    k.scopes = scopes.iter().map(|s| s.to_string()).collect();
    k
}

/// A worker that answers 202 (the run stays `running` until its result) and keeps every start
/// request's body, by run id.
async fn accepting_worker() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move |body: axum::body::Bytes| {
            let s = s.clone();
            async move {
                s.lock()
                    .unwrap()
                    .push(serde_json::from_slice::<Value>(&body).unwrap());
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let (url, _) = serve_worker(app, Default::default()).await;
    (url, seen)
}

async fn call(
    s: &Server,
    bearer: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut r = s
        .http
        .request(method, format!("{}{path}", s.base))
        .bearer_auth(bearer);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let st = r.status();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// Starts a run through a signed GitHub delivery and waits until the worker has its start request
/// and the run reads `running`. Returns the run id and the start request's body.
async fn running_run(s: &Server, seen: &Mutex<Vec<Value>>, delivery: &str) -> (String, Value) {
    let (st, a) = s
        .post_github("pull_request", delivery, opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{a}");
    let run = a["deliveries"][0]["runId"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, r) = call(
            s,
            "admin-key",
            reqwest::Method::GET,
            &format!("/v1/runs/{run}"),
            None,
        )
        .await;
        if r["status"] == "running" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run never ran: {r}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let body = seen
        .lock()
        .unwrap()
        .iter()
        .find(|b| b["runId"] == run.as_str())
        .cloned()
        .expect("the worker got the start request");
    (run, body)
}

async fn status_of(s: &Server, run: &str) -> Value {
    call(
        s,
        "admin-key",
        reqwest::Method::GET,
        &format!("/v1/runs/{run}"),
        None,
    )
    .await
    .1["status"]
        .clone()
}

/// (actor, target, outcome, detail.reported) of the `run.result` entries, oldest first.
async fn result_entries(s: &Server) -> Vec<(String, String, String, Value)> {
    let (st, page) = call(
        s,
        "admin-key",
        reqwest::Method::GET,
        "/v1/audit?action=run.result&afterSeq=0",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{page}");
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
                e["detail"]["reported"].clone(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_runs_executor_reports_its_result_and_every_report_is_audited() {
    let (url, seen) = accepting_worker().await;
    let s = start_with_keys(
        Some(url),
        fast_retry(2),
        0,
        vec![
            ApiKey::full_scope("admin", "admin-key"),
            key("session", "session-key", &["runs:create", "runs:read"]),
            key("worker", "worker-key", &["runs:result"]),
        ],
    )
    .await;
    let (run, start) = running_run(&s, &seen, "rr-1").await;
    let result = format!("/v1/runs/{run}/result");

    // The session key: refused like its cancel, and the run goes on.
    let (st, v) = call(
        &s,
        "session-key",
        reqwest::Method::POST,
        &result,
        Some(json!({"status": "cancelled"})),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(v["error"], "forbidden");
    let (st, _) = call(
        &s,
        "session-key",
        reqwest::Method::POST,
        &format!("/v1/runs/{run}/cancel"),
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(status_of(&s, &run).await, "running");

    // The start request carried the run's result token; another run's token, or a made-up one, is
    // not this run's: refused like an unknown key (and counted as one), not recorded (no valid
    // credential: anyone could fill the audit log with such requests).
    let token = start["resultToken"]
        .as_str()
        .expect("resultToken in the start request")
        .to_string();
    assert!(
        token.starts_with("tbres_") && token.len() == "tbres_".len() + 64,
        "{token}"
    );
    let (run2, start2) = running_run(&s, &seen, "rr-2").await;
    let token2 = start2["resultToken"].as_str().unwrap().to_string();
    assert_ne!(token, token2, "one token per run");
    for forged in [token2.clone(), format!("tbres_{}", "0".repeat(64))] {
        let (st, v) = call(
            &s,
            &forged,
            reqwest::Method::POST,
            &result,
            Some(json!({"status": "cancelled"})),
        )
        .await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{v}");
        assert_eq!(v["error"], "unauthenticated");
    }
    assert_eq!(status_of(&s, &run).await, "running");

    // The executor's report, with its token: the run completes.
    let (st, v) = call(
        &s,
        &token,
        reqwest::Method::POST,
        &result,
        Some(json!({"status": "completed", "output": {"ok": true}})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed");
    assert_eq!(status_of(&s, &run).await, "completed");
    // A key an operator gave `runs:result` (a worker's key) may report too.
    let (st, v) = call(
        &s,
        "worker-key",
        reqwest::Method::POST,
        &format!("/v1/runs/{run2}/result"),
        Some(json!({"status": "failed"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(status_of(&s, &run2).await, "failed");
    // No credential at all is 401, like every guarded route.
    let r = s
        .http
        .post(format!("{}{result}", s.base))
        .json(&json!({"status": "cancelled"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    let r = |a: &str, t: &str, o: &str, rep: &str| {
        (a.to_string(), t.to_string(), o.to_string(), json!(rep))
    };
    assert_eq!(
        result_entries(&s).await,
        vec![
            r("session", &run, "forbidden", "cancelled"),
            r("result-token", &run, "ok", "completed"),
            r("worker", &run2, "ok", "failed"),
        ],
        "every report with a valid credential, accepted or refused, is recorded; no unknown token"
    );
    let (_, v) = call(
        &s,
        "admin-key",
        reqwest::Method::GET,
        "/v1/audit/verify",
        None,
    )
    .await;
    assert_eq!(v["ok"], true, "{v}");
}

/// Before: a token-shaped bearer skipped the wrong-key throttle (the body was read and the run looked
/// up first), the run's right token from a throttled address was accepted, and every refused token
/// appended an audit entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_tokens_from_a_throttled_address_are_refused_unchecked_and_not_recorded() {
    let (url, seen) = accepting_worker().await;
    let s = start_with_keys(
        Some(url),
        fast_retry(2),
        0,
        vec![ApiKey::full_scope("admin", "admin-key")],
    )
    .await;
    s.engine.set_failed_keys_limit(3);
    let (run, start) = running_run(&s, &seen, "rr-t1").await;
    let token = start["resultToken"].as_str().unwrap().to_string();
    let result = format!("{}/v1/runs/{run}/result", s.base);
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(IpAddr::V4(Ipv4Addr::from(ip)))
            .build()
            .unwrap()
    };
    let (guesser, worker) = (from([127, 0, 0, 2]), from([127, 0, 0, 1]));
    let report = |c: &reqwest::Client, bearer: &str| {
        c.post(&result)
            .bearer_auth(bearer)
            .json(&json!({"status": "cancelled"}))
            .send()
    };
    for i in 0..3 {
        let r = report(&guesser, &format!("tbres_{i:064}")).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "guess {i}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
    }
    // Past the limit every bearer from the address is refused unchecked: a made-up token, the run's
    // own token, a right API key.
    for bearer in [
        format!("tbres_{}", "f".repeat(64)),
        token.clone(),
        "admin-key".into(),
    ] {
        let r = report(&guesser, &bearer).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{bearer}");
        let wait: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "rate_limited");
    }
    assert_eq!(status_of(&s, &run).await, "running");
    assert_eq!(
        result_entries(&s).await,
        vec![],
        "refused unknown tokens and throttled requests are not recorded"
    );
    // The worker, from another address, reports with the token: accepted and recorded.
    let r = worker
        .post(&result)
        .bearer_auth(&token)
        .json(&json!({"status": "completed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(status_of(&s, &run).await, "completed");
    assert_eq!(
        result_entries(&s).await,
        vec![(
            "result-token".to_string(),
            run.clone(),
            "ok".to_string(),
            json!("completed")
        )]
    );
}
